#!/usr/bin/env bash
set -u
# Session 11, call 5: compute-sanitizer racecheck over one KDA tensor-core case at K = V = 128 (the
# first try of this call, with a filter that matched no test, also ran CudaIndexer.* 4 times: all passed).
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack


el racecheck; timeout 190 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2K128V128_T192_docs3_zeroState_noDhT_mixed' > "$L/racecheck.txt" 2>&1; echo "rc=$?"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|tests ran|PASSED|FAILED" "$L/racecheck.txt" | head -5; pack
el done
