#!/usr/bin/env bash
# Session 11, call 4 (final tree: kda11, dsa11 and moe11 merged): the whole gpu_suite + GPU goldens,
# bench dsa (8K/32K, the V3.2 indexer, 64K/128K) with ncu at 8K, bench moe with torch._grouped_mm
# in the same call and ncu at A uniform, the expert-LoRA step and the default step (KDA share).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
dsa_rows() { python3 -c "
import json
for r in json.load(open('$1'))['runs']: print({k:(round(v,2) if isinstance(v,float) else v) for k,v in r.items()})" 2>&1 | cut -c1-900; }
el test; OUT=$L timeout 240 tools/gpu.sh test > "$L/test.txt" 2>&1; tail -2 "$L/test.txt"
grep -E "^FAIL|\[  FAILED" "$L/test.txt" | cut -c1-300 | head -20; pack
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}  # tools/gpu.sh test unpacked into $D
el dsa; timeout 60 $D/bin/moetrain bench dsa --tokens 8192,32768 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"; dsa_rows "$L/bench_dsa.json"; pack
el ncu dsa; timeout 60 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench dsa --tokens 8192 --iters 1 > "$L/ncu_dsa.csv" 2> "$L/ncu_dsa.log"; echo "rc=$?"; pack
el moe; timeout 120 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"; pack
el ncu moe; timeout 60 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 1 > "$L/ncu_moe.csv" 2> "$L/ncu_moe.log"; echo "rc=$?"; pack
el step experts; timeout 80 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
el step; timeout 70 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"; step_line "$L/step.json"; pack
el memcheck; timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='*KConcat*:*CudaIndexer*:*CudaDsaTopk*' --gtest_brief=1 > "$L/memcheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|FAILED|tests ran" "$L/memcheck.txt" | head -5; pack
el v32; timeout 50 $D/bin/moetrain bench dsa --tokens 8192,32768 --index-heads 64 --index-dim 128 --iters 1 --json "$L/bench_dsa_v32.json" > "$L/dsa_v32.txt" 2>&1; echo "rc=$?"; dsa_rows "$L/bench_dsa_v32.json"; pack
el dsa long; timeout 60 $D/bin/moetrain bench dsa --tokens 65536,131072 --iters 1 --json "$L/bench_dsa_long.json" > "$L/dsa_long.txt" 2>&1; echo "rc=$?"; dsa_rows "$L/bench_dsa_long.json"; pack
el done
