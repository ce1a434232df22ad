#!/usr/bin/env bash
# Session 14, call 1: main's commits not yet run on a GPU (kda_gate sums through colsum_accumulate,
# the shared ldmatrix pair, the Split key gradient's fragment helper) plus kda13c rebased (branch
# kda14: the backward state pass v2, the pre pass's load reorder): device tests and goldens,
# racecheck / synccheck over the new backward pass's forms and one Split sparse MQA case, bench kda
# (the backward state pass v2 against v1 in one run), per-launch ncu of bench kda for the helpers.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
el test; timeout 200 $D/bin/gpu_suite --gtest_filter='*Kda*:*CudaSparseMqa*:*CudaDsa*:*CudaModel*:CudaGroupedFfn.*:*Flash*:*Indexer*:*CudaDecode*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|state passes" "$L/suite.txt" | head -30; pack
timeout 60 $D/bin/test_golden --gtest_filter='GoldenCuda.*' > "$L/golden.txt" 2>&1; echo "golden rc=$?"; grep -E "PASSED|FAILED" "$L/golden.txt" | head -3; pack
F='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T250_docs2_h0_dhT_mild:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K64V64_T280_docs3_h0_dhT_mild:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2K128V128_T300_docs1_h0_dhT_strong'
el racecheck; timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter="$F" > "$L/racecheck.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck.txt" | head -3
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter="$F" > "$L/synccheck.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/synccheck.txt" | head -3; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], 'fwd %.3f eval %.3f fwdbwd %.3f (bwd state v1 %.3f) gate+core %.3f / %.3f'%(r['fwd_ms'],r['fwd_eval_ms'],r['fwdbwd_ms'],r['fwdbwd_ms_bwd_state_v1'],r['gate_core_fwd_ms'],r['gate_core_fwdbwd_ms']))" 2>&1 | tail -4; pack
el ncu; timeout 90 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.err"; echo "rc=$?"; pack
el mqarace; timeout 75 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa.SplitTileEdges' > "$L/racecheck_mqa.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_mqa.txt" | head -3; pack
el done
