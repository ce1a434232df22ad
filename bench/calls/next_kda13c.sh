#!/usr/bin/env bash
# For the next session's first device call (kda13c: the backward state pass v2 and the bwd_pre
# load reorder, written in session 13 without a GPU): the KDA device tests with both backward
# passes, racecheck / synccheck over the new kernel's forms, bench kda (v2 against v1 in one run),
# per-kernel ncu times. Copy to .gpu/ after `tools/gpu.sh pack` on this branch.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
F='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T250_docs2_h0_dhT_mild:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K64V64_T280_docs3_h0_dhT_mild:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2K128V128_T300_docs1_h0_dhT_strong'
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='*Kda*:*CudaModel*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|state passes" "$L/suite.txt" | head -30; pack
el racecheck; timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter="$F" > "$L/racecheck.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck.txt" | head -3
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter="$F" > "$L/synccheck.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/synccheck.txt" | head -3; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], 'fwd %.3f fwdbwd %.3f (bwd state v1 %.3f)'%(r['fwd_ms'],r['fwdbwd_ms'],r['fwdbwd_ms_bwd_state_v1']))" 2>&1 | tail -4; pack
el ncu; timeout 90 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.err"; echo "rc=$?"; pack
el done
