#!/usr/bin/env bash
# Session 21, call 7 (issue 14): the transposed side pack one warp per block through shared memory,
# the xa / dr layout kernel's first row tiles by a block scan; the fused dr GEMM where it pays again.
# Tests, memcheck and synccheck on the fused cases, ncu per kernel at B uniform, bench moe on all
# four cases against torch, the expert-LoRA step.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=420
el test; timeout 110 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
f='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop:CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms'
for tool in memcheck synccheck; do
  el $tool; timeout 60 compute-sanitizer --tool $tool $D/bin/gpu_suite --gtest_filter="$f" > "$L/$tool.txt" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/$tool.txt" | head -3; pack
done
el "ncu B"; timeout 40 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases B:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_B.csv" 2> "$L/ncu_B.err"; echo "ncu rc=$?"; pack
el "moe"
timeout 150 $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 45 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch; pack
l=$(left); el "step (${l}s left)"
if [ "$l" -gt 60 ]; then
  timeout $(( l - 10 )) $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
fi
el done
