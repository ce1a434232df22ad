#!/usr/bin/env bash
# Branch next21 (issue 14; prepared in session 21, not yet run on the device): the tiles past
# n-block 0 skip the per-stage side slice (mbarrier.complete_tx of its bytes), and the n-block-0
# tiles count their xa / dr once per warp, and n-block 0 (which forms dr and which the others wait
# for) leaves dB to the other n-blocks. Tests, memcheck and synccheck on the fused cases, ncu
# per kernel at B and A uniform, bench moe on all four cases against torch.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=400
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
f='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop:CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms'
for tool in memcheck synccheck; do
  el $tool; timeout 60 compute-sanitizer --tool $tool $D/bin/gpu_suite --gtest_filter="$f" > "$L/$tool.txt" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/$tool.txt" | head -3; pack
done
for c in B A; do
  el "ncu $c"; timeout 50 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants dr=staged > "$L/ncu_$c.csv" 2> "$L/ncu_$c.err"; echo "ncu rc=$?"; pack
done
l=$(left); el "moe (${l}s left)"
timeout $(( l - 50 )) $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 45 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch; pack
el done
