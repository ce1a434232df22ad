#!/usr/bin/env bash
# Session 17, call 5 (issue 14): the K-concatenation buffers at 128-byte row pitches
# (grouped_ffn_row_pitch) and out_grads over 128-row blocks with its copies addressed once: the
# grouped FFN, LoRA and MoE-layer device tests, bench moe with torch in the next command, the LoRA
# kernels at the running clocks (ncu), the steps if time is left.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=330
el test; timeout 110 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul*:*CudaModel*:CudaGraph*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
el moe; timeout 90 $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch
pack
el ncu; timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_A.csv" 2> "$L/ncu_A.err"; echo "ncu rc=$?"; pack
l=$(left); el "steps (${l}s left)"
if [ "$l" -gt 100 ]; then
  timeout 50 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
fi
el done
