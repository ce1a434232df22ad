#!/usr/bin/env bash
# Session 16, call 5: compute-sanitizer over kda16's new default KDA path on the final head (the
# backward's prep with the Delta and E / F tails, bf16 chunk states read by the state pass, products
# and grads): racecheck over every kernel of two small cases, memcheck over one; then as much of the
# whole `*Kda*` suite as the budget leaves (call 4 ran a 63-test subset).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=140
left() { echo $(( budget - ($(date +%s) - t0) )); }
for c in H2K128V128_T300_docs1_h0_dhT_strong H2K64V64_T393_docs5_h0_dhT_mild; do
  el "racecheck $c"; timeout 50 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter="KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/$c" > "$L/racecheck_$c.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_$c.txt" | head -3; pack
done
el memcheck; timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2K64V64_T393_docs5_h0_dhT_mild:Kda/CudaKda.ForwardBackward/Chunked64_K128V64_h0_dhT_strongDecay' > "$L/memcheck.txt" 2>&1; echo "rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$L/memcheck.txt" | head -3; pack
l=$(left); el "the KDA suite (${l}s left)"
if [ "$l" -gt 20 ]; then
  timeout "$l" $D/bin/gpu_suite --gtest_filter='*Kda*' > "$L/suite_kda.txt" 2>&1; echo "rc=$?"
  grep -E "^\[  (PASSED|FAILED)|Failure|seed=|Expected" "$L/suite_kda.txt" | head -12
  echo "ran: $(grep -c '^\[       OK' "$L/suite_kda.txt") ok, $(grep -c '^\[  FAILED  \].*ms)' "$L/suite_kda.txt") failed"; pack
fi
el done
