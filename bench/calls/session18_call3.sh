#!/usr/bin/env bash
# Session 18, call 3 (issue 14): xa = X A_gu^T formed in the gate/up GEMM's mainloop
# (ops/cuda/cutlass/lora_xa_mainloop.cuh, GroupedFfnParams::lora_xa = gemm). The new kernel's test
# under memcheck, the grouped GEMM / FFN / LoRA / MoE / model device tests, bench moe (the skinny
# xa kernel beside it: xa=staged) with torch._grouped_mm in the next command, the LoRA kernels at
# the running clocks (ncu), the expert-LoRA step if time is left.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=420
el new; timeout 60 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms' > "$L/new.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|Failure|seed=|Expected|max|worst" "$L/new.txt" | head -24; pack
el memcheck; timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop' > "$L/memcheck.txt" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$L/memcheck.txt" | head -3; pack
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul*:CudaGroupedGemmConfig*:*CudaModel*:CudaGraph*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
el moe; timeout 100 $D/bin/moetrain bench moe --iters 10 --lora-variants xa=staged --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch
python3 -c "
import json
for r in json.load(open('$L/bench_moe.json'))['runs']: print(r['case'], r['routing'], 'xa=%s lora %.3f (+%.1f%%); xa=staged %.3f (+%.1f%%)' % (r.get('lora_xa_kernels'), r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], r.get('lora_xa_staged_fwdbwd_ms', float('nan')), 100 * r.get('lora_xa_staged_overhead_fwdbwd', float('nan'))))" 2>&1 | tail -4
pack
el ncu; timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_A.csv" 2> "$L/ncu_A.err"; echo "ncu rc=$?"; pack
l=$(left); el "step (${l}s left)"
if [ "$l" -gt 70 ]; then
  timeout 50 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
fi
el done
