#!/usr/bin/env bash
# Session 18, call 6 (issue 14): the fused xa gate/up GEMM forms xa in the n-block-0 tile of each
# row block only; the other n-blocks' tiles wait for its store and read xa back (call 5: the xa
# wgmmas cost ~150 us when every tile formed xa). The new kernel's test, the FFN / LoRA / MoE / model
# tests, the LoRA kernels at the running clocks (ncu), bench moe (xa=staged beside it) with torch.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=290
el new; timeout 60 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop' > "$L/new.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=|Expected|bf16   rel err" "$L/new.txt" | head -8; pack
el ncu; timeout 40 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_A.csv" 2> "$L/ncu_A.err"; echo "ncu rc=$?"; pack
el test; timeout 100 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.AllForms*:*CudaModel*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
l=$(left); el "moe (${l}s left)"
if [ "$l" -gt 80 ]; then
  timeout $(( l - 45 )) $D/bin/moetrain bench moe --iters 10 --cases A:uniform,B:uniform --lora-variants xa=staged --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
  timeout 40 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
  moe_vs_torch
  python3 -c "
import json
for r in json.load(open('$L/bench_moe.json'))['runs']: print(r['case'], r['routing'], 'xa=%s lora %.3f (+%.1f%%); xa=staged %.3f (+%.1f%%)' % (r.get('lora_xa_kernels'), r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], r.get('lora_xa_staged_fwdbwd_ms', float('nan')), 100 * r.get('lora_xa_staged_overhead_fwdbwd', float('nan'))))" 2>&1 | tail -4
  pack
fi
el done
