#!/usr/bin/env bash
# Session 22, call 7 (issue 14): main after the review (comments, test labels, the occupancy
# query's error message): the CUDA graph tests (the fused GEMMs' occupancy query under stream
# capture) and the fused GEMM cases.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaGraph.*:CudaGroupedFfn.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
el done
