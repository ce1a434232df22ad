#!/usr/bin/env bash
# Session 18, call 4 (issue 14): the fused xa gate/up GEMM with an epilogue without a C source (D's
# stages only) beside the stock kernel's four mainloop stages (call 3's 128 x 16 epilogue sub-tile:
# 1,750 us at A against 1,549 + 177 separately). The new kernel's test (its CPU reference now on
# contiguous weights) and memcheck, the FFN / LoRA / MoE / model tests, the LoRA kernels at the
# running clocks (ncu), bench moe (xa=staged beside it) with torch in the next command.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=400
el new; timeout 60 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop' > "$L/new.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=|Expected|rel err" "$L/new.txt" | head -12; pack
el ncu; timeout 50 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_A.csv" 2> "$L/ncu_A.err"; echo "ncu rc=$?"; pack
el memcheck; timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop' > "$L/memcheck.txt" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$L/memcheck.txt" | head -3; pack
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul*:CudaGroupedGemmConfig*:*CudaModel*:CudaGraph*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
l=$(left); el "moe (${l}s left)"
if [ "$l" -gt 110 ]; then
  timeout 100 $D/bin/moetrain bench moe --iters 10 --lora-variants xa=staged --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
  timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
  moe_vs_torch
  python3 -c "
import json
for r in json.load(open('$L/bench_moe.json'))['runs']: print(r['case'], r['routing'], 'xa=%s lora %.3f (+%.1f%%); xa=staged %.3f (+%.1f%%)' % (r.get('lora_xa_kernels'), r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], r.get('lora_xa_staged_fwdbwd_ms', float('nan')), 100 * r.get('lora_xa_staged_overhead_fwdbwd', float('nan'))))" 2>&1 | tail -4
  pack
fi
el done
