#!/usr/bin/env bash
# Session 22, call 6 (issue 14): main after skew22 was measured and not merged (7751b98 with the
# fused GEMM tests' 160-expert cases): the grouped / LoRA / model device tests, memcheck and
# synccheck over the fused cases.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=300
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
f='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop:CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms'
for tool in memcheck synccheck; do
  el $tool; timeout 70 compute-sanitizer --tool $tool $D/bin/gpu_suite --gtest_filter="$f" > "$L/$tool.txt" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/$tool.txt" | head -3; pack
done
el done
