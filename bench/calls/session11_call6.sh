#!/usr/bin/env bash
set -u
# Session 11, call 6: racecheck over the 32-head KDA case, the indexer tensor-core kernels and the
# staged top-k (the last two did not finish within 55 s each).
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
for f in 'KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T250_docs2_h0_dhT_mild' 'CudaIndexer.ScoresTensorCoreOddShapes:CudaIndexer.ScoresKlFused' 'CudaDsaTopk.StagedHeadSlices'; do
el "racecheck $f"; timeout 55 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter="$f" > "$L/rc.txt" 2>&1; echo "rc=$?"
grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$L/rc.txt" | head -3; done
el done
