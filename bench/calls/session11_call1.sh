#!/usr/bin/env bash
# Session 11, call 1 (tree 84aba42 = session 10's pack): kernel profiles for this session's work
# (ncu of bench dsa at 8K, bench moe A uniform with LoRA, bench kda T8192), then issue 13's unrun
# items: the two-layer DSA model training at 131072 tokens, the DSA step model at 32K, bench dsa
# at 64K/128K and the V3.2 indexer (64 x 128) variant.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
NCU="ncu --metrics gpu__time_duration.sum --csv"
el ncu dsa; timeout 120 $NCU $D/bin/moetrain bench dsa --tokens 8192 --iters 1 > "$L/ncu_dsa.csv" 2> "$L/ncu_dsa.log"; echo "rc=$?"; pack
el ncu moe; timeout 90 $NCU $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 1 > "$L/ncu_moe.csv" 2> "$L/ncu_moe.log"; echo "rc=$?"; pack
el ncu kda; timeout 60 $NCU $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.log"; echo "rc=$?"; pack
el "train dsa-2l 131072"
timeout 200 $D/bin/moetrain bench step --model bench/models/dsa-2l.json --tokens 131072 --lora-rank 0 \
  --warmup 1 --steps 4 --lr 1e-3 --json "$L/step_dsa2l_131072.json" > "$L/step_dsa2l_131072.txt" 2>&1
echo "rc=$?"; tail -5 "$L/step_dsa2l_131072.txt"; pack
el "step dsa 32K"
timeout 120 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l-dsa.json --tokens 32768 \
  --json "$L/step_dsa_32768.json" > "$L/step_dsa_32768.txt" 2>&1; echo "rc=$?"; tail -3 "$L/step_dsa_32768.txt"; pack
el "dsa long"; timeout 100 $D/bin/moetrain bench dsa --tokens 65536,131072 --iters 1 --json "$L/bench_dsa_long.json" > "$L/dsa_long.txt" 2>&1; echo "rc=$?"; tail -3 "$L/dsa_long.txt"; pack
el "dsa v3.2 indexer"; timeout 60 $D/bin/moetrain bench dsa --tokens 8192,32768 --index-heads 64 --index-dim 128 --iters 1 --json "$L/bench_dsa_v32.json" > "$L/dsa_v32.txt" 2>&1; echo "rc=$?"; pack
el done; ls -la "$OUT"
