#!/usr/bin/env bash
# Session 17, call 6 (final): compute-sanitizer over the changed out_grads kernel (racecheck) and the
# K-concatenation path at 128-byte row pitches (memcheck), the GPU goldens, then the KDA suite (its
# runner moved into tests/cuda/kda_inputs.h) in the time left. Binaries: main 9bbeb43.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=300
el racecheck; timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=out_grads_kernel $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.KConcatLoraInTheBaseGemms' > "$L/racecheck.txt" 2>&1; echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$L/racecheck.txt" | head -3; pack
el memcheck; timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.KConcatLoraInTheBaseGemms:CudaMoe*' > "$L/memcheck.txt" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$L/memcheck.txt" | head -3; pack
el golden; timeout 40 $D/bin/test_golden --gtest_filter='GoldenCuda.*' > "$L/golden.txt" 2>&1; echo "golden rc=$?"; tail -3 "$L/golden.txt"; pack
l=$(left); el "kda (${l}s left)"
if [ "$l" -gt 30 ]; then
  timeout $(( l - 10 )) $D/bin/gpu_suite --gtest_filter='*Kda*' > "$L/kda.txt" 2>&1; echo "kda rc=$? (124: cut by the budget)"
  echo "passed $(grep -c '^\[       OK' "$L/kda.txt"), failed $(grep -c '^\[  FAILED  \]' "$L/kda.txt")"; grep -E "^\[  FAILED|Failure|seed=" "$L/kda.txt" | head -8; pack
fi
el done
