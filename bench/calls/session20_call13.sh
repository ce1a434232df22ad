#!/usr/bin/env bash
# Session 20, call 13 (issue 14, plan step 3): the gate/up dX GEMM forms dr_gu and dB_gu as the
# down one does (grouped_ffn_lora_dx for both projections). Tests, memcheck on the new cases,
# bench moe A and B uniform (dr=staged beside), ncu per kernel at both.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=330
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12
grep -E "dr in both.*bf16|out 384.*bf16" "$L/suite.txt" | head -12; pack
el memcheck; timeout 60 compute-sanitizer --tool memcheck $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop' > "$L/memcheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/memcheck.txt" | head -3; pack
l=$(left); el "moe (${l}s left)"
timeout 150 $D/bin/moetrain bench moe --iters 10 --cases A:uniform,B:uniform --lora-variants dr=staged --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 40 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch
python3 -c "
import json
for r in json.load(open('$L/bench_moe.json'))['runs']: print(r['case'], r['routing'], 'dr=%s lora %.3f (+%.1f%%, median +%.1f%%); dr=staged %.3f (+%.1f%%)' % (r.get('lora_dr_kernels'), r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], 100 * r['lora_overhead_fwdbwd_median'], r.get('lora_dr_staged_fwdbwd_ms', float('nan')), 100 * r.get('lora_dr_staged_overhead_fwdbwd', float('nan'))))" 2>&1 | tail -4
pack
for c in A B; do
  l=$(left); [ "$l" -gt 30 ] || break
  el "ncu $c"; timeout 40 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_$c.csv" 2> "$L/ncu_$c.err"; echo "ncu rc=$?"; pack
done
el done
