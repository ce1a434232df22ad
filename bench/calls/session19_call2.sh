#!/usr/bin/env bash
# Session 19, call 2 (issue 14): the padded expert weights' rows at 128-byte pitches
# (grouped_ffn_row_pitch(in, r), was in + r: every W row but one in four started mid-line). The
# FFN / LoRA / MoE / model tests, ncu per kernel at A and B (LoRA run only), bench moe with torch,
# the expert-LoRA step.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=560
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*:*CudaModel*:*Memory*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
for c in A B; do
  el "ncu $c"; timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_$c.csv" 2> "$L/ncu_$c.err"; echo "ncu rc=$?"; pack
done
el moe; timeout 200 $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch; pack
l=$(left); el "step (${l}s left)"
if [ "$l" -gt 60 ]; then
  timeout $(( l - 10 )) $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
fi
el done
