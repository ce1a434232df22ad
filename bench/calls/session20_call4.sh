#!/usr/bin/env bash
# Session 20, call 4: store_rk's barriers as barrier.sync after __syncwarp, R's load branch-free
# (call 3's synccheck: diverged warps at bar.sync, then an illegal instruction). synccheck and the
# tests, then call 1's bench.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=520
F='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop'
el synccheck; timeout 100 compute-sanitizer --tool synccheck $D/bin/gpu_suite --gtest_filter=$F > "$L/synccheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)|Barrier|at 0x" "$L/synccheck.txt" | head -6; pack
el direct; timeout 60 $D/bin/gpu_suite --gtest_filter=$F > "$L/direct.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|exception|bf16" "$L/direct.txt" | head -12; pack
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
l=$(left); el "moe (${l}s left)"
if [ "$l" -gt 80 ]; then
  timeout $(( l - 45 )) $D/bin/moetrain bench moe --iters 10 --cases A:uniform,B:uniform --lora-variants dr=staged --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
  tail -2 "$L/moe.txt"
  timeout 40 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
  moe_vs_torch
  python3 -c "
import json
for r in json.load(open('$L/bench_moe.json'))['runs']: print(r['case'], r['routing'], 'dr=%s lora %.3f (+%.1f%%, median +%.1f%%); dr=staged %.3f (+%.1f%%)' % (r.get('lora_dr_kernels'), r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], 100 * r['lora_overhead_fwdbwd_median'], r.get('lora_dr_staged_fwdbwd_ms', float('nan')), 100 * r.get('lora_dr_staged_overhead_fwdbwd', float('nan'))))" 2>&1 | tail -4
  pack
fi
el done
