#!/usr/bin/env bash
# Session 10, call 3: the fused expert-LoRA SwiGLU backward (07005e7) and dsa10's issue-13 items:
# MoE/LoRA/graph device tests and CudaDsaLong, ncu of bench moe A uniform, bench moe with
# torch._grouped_mm in the same call, the expert-LoRA step, then bench/calls/session10_dsa10.sh's
# DSA step model (8K, 32K), the two-layer DSA model training at 131072 tokens, bench dsa at 64K
# and 128K.
set -u
cd "$(dirname "$0")/.."
. bench/calls/lib.sh
unpack
el test; timeout 200 $D/bin/gpu_suite --gtest_filter='CudaGrouped*:CudaLora*:CudaGraph*:CudaMoe*' > "$L/suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|error" "$L/suite.txt" | head -20; pack
el ncu moe; timeout 100 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 1 > "$L/ncu_moe.csv" 2> "$L/ncu_moe.log"; echo "rc=$?"; pack
el moe; timeout 150 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"; pack
el step; timeout 80 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "step rc=$?"; pack
el dsa10; OUT=$L timeout 420 bash bench/calls/session10_dsa10.sh 2>&1 | grep -v "^\[ *\(RUN\|OK\)" | tail -40; pack
el dsa long; timeout 150 $D/bin/moetrain bench dsa --tokens 65536,131072 --iters 1 --json "$L/bench_dsa_long.json" > "$L/dsa_long_bench.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa_long.json'))['runs']: print({k:(round(v,2) if isinstance(v,float) else v) for k,v in r.items()})" 2>&1 | cut -c1-700; pack
el done; ls -la "$OUT"
