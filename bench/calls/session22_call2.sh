#!/usr/bin/env bash
# Session 22, call 2 (issue 14): the fused LoRA GEMMs' persistent grid sized by
# cudaOccupancyMaxActiveClusters (the residency their waits need). Tests, memcheck and synccheck on
# the fused cases, ncu per kernel with the grid size at B and A uniform, bench moe on all four
# cases against torch; a standalone timing of the adapter pack's jobs (.gpu/packbench, scratch
# code not in the repository).
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
if [ -x .gpu/packbench ]; then el packbench; timeout 30 .gpu/packbench | tee "$L/packbench.txt"; pack; fi
for c in B A; do
  el "ncu $c"; timeout 40 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,launch__grid_size --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_$c.csv" 2> "$L/ncu_$c.err"; echo "ncu rc=$?"; pack
done
l=$(left); el "moe all (${l}s left)"
timeout $(( l - 50 )) $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 45 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch; pack
el done
