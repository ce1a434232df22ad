#!/usr/bin/env bash
# Session 20, call 1 (issue 14, plan step 2): the down dX GEMM forms dr = dY (s B) and dB += s dY^T ha
# in its mainloop (lora_xa_mainloop.cuh, kDb). Its direct test, memcheck on it, the FFN / LoRA /
# MoE / model tests, then bench moe A and B uniform with dr=gemm (the default) and dr=staged beside.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=480
el new; timeout 90 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop:CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms' > "$L/new.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|Failure|seed=|Expected|rel|mainloop.*bf16" "$L/new.txt" | head -30; pack
el memcheck; timeout 120 compute-sanitizer --tool memcheck $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop' > "$L/memcheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)|Invalid|at 0x" "$L/memcheck.txt" | head -8; pack
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
l=$(left); el "moe (${l}s left)"
if [ "$l" -gt 80 ]; then
  timeout $(( l - 45 )) $D/bin/moetrain bench moe --iters 10 --cases A:uniform,B:uniform --lora-variants dr=staged --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
  tail -3 "$L/moe.txt"
  timeout 40 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
  moe_vs_torch
  python3 -c "
import json
for r in json.load(open('$L/bench_moe.json'))['runs']: print(r['case'], r['routing'], 'dr=%s lora %.3f (+%.1f%%, median +%.1f%%); dr=staged %.3f (+%.1f%%)' % (r.get('lora_dr_kernels'), r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], 100 * r['lora_overhead_fwdbwd_median'], r.get('lora_dr_staged_fwdbwd_ms', float('nan')), 100 * r.get('lora_dr_staged_overhead_fwdbwd', float('nan'))))" 2>&1 | tail -4
  pack
fi
el done
