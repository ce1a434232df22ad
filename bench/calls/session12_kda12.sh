#!/usr/bin/env bash
# kda12 (issue 12, next session): validation of the restructured tensor-core prep
# (prep_tc_kernel: T by block inverse, Aqk and KK tiles per warp together, cp.async loads).
# Device tests of every KDA path, compute-sanitizer racecheck over the prep's block test (new
# barrier and __syncwarp structure) and memcheck over the tensor-core suite, bench kda, ncu of
# the prep alone (time, throughput, stall reasons). Expected: all tests pass with errors like
# session 11 call 3's; racecheck and memcheck 0 hazards / errors; prep_tc_kernel well under its
# session-11 time (see the kda12 report), bench kda forward below 2.48 ms at B2 T8192.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 200 $D/bin/gpu_suite --gtest_filter='*CudaKda*:KdaChunkLayout*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite.txt" | head -20; grep -h "fp32 block" "$L/suite.txt" | head -8; pack
el racecheck; timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaKdaTcPrepared.BlockIsComplete*' > "$L/racecheck.txt" 2>&1; echo "rc=$?"
grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$L/racecheck.txt" | head -3; pack
el memcheck; timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='*CudaKdaTc*' --gtest_brief=1 > "$L/memcheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|FAILED" "$L/memcheck.txt" | head -5; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"; tail -12 "$L/kda.txt"; pack
el ncu; timeout 120 ncu --kernel-name regex:prep_tc_kernel --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats $D/bin/moetrain bench kda --iters 1 > "$L/ncu_prep.txt" 2>&1; echo "rc=$?"
grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" "$L/ncu_prep.txt" | head -20; pack
el done
