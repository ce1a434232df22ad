#!/usr/bin/env bash
# Session 19, call 1 (issue 14): session 18's last two fixes to the fused xa gate/up GEMM (empty
# cluster tiles counted per cluster-rounded tile; xa stored before the register-A wgmma) had not
# run on the device. Its tests, memcheck on them, the FFN / LoRA / MoE / model tests, then
# bench moe with --lora-xa gemm (xa=staged beside it) and torch.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=400
el new; timeout 60 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms' > "$L/new.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|Failure|seed=|Expected|xa in the (GEMM|mainloop).*bf16" "$L/new.txt" | head -20; pack
el memcheck; timeout 120 compute-sanitizer --tool memcheck $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop' > "$L/memcheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/memcheck.txt" | head -4; pack
el test; timeout 100 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*:*CudaModel*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
l=$(left); el "moe (${l}s left)"
if [ "$l" -gt 80 ]; then
  timeout $(( l - 45 )) $D/bin/moetrain bench moe --iters 10 --cases A:uniform,B:uniform --lora-xa gemm --lora-variants xa=staged --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
  timeout 40 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
  moe_vs_torch
  python3 -c "
import json
for r in json.load(open('$L/bench_moe.json'))['runs']: print(r['case'], r['routing'], 'xa=%s lora %.3f (+%.1f%%); xa=staged %.3f (+%.1f%%)' % (r.get('lora_xa_kernels'), r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], r.get('lora_xa_staged_fwdbwd_ms', float('nan')), 100 * r.get('lora_xa_staged_overhead_fwdbwd', float('nan'))))" 2>&1 | tail -4
  pack
fi
el done
