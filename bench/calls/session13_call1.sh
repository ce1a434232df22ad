#!/usr/bin/env bash
# Session 13, call 1: main with kda13 (the decay gate fused into the chunked KDA core) and dsa13 (the
# Split sparse MQA kernels): their device tests, the GPU goldens, `bench kda`, `bench dsa` (Split
# against Chained), racecheck / synccheck over the sparse MQA tests; then profiles for the helpers: per-launch kernel times of
# the MoE at shapes A and B (frozen, full and LoRA forward + backward in bench moe's order), the KDA
# core with its fused gate at B2 T8192, and the sparse MQA kernels' stall reasons at 8K.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='*CudaKda*:*KdaGate*:*CudaModel*:*CudaDecode*:*CudaSparseMqa*:*CudaDsa*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|error" "$L/suite.txt" | head -30; pack
timeout 60 $D/bin/test_golden --gtest_filter='GoldenCuda.*' > "$L/golden.txt" 2>&1; echo "golden rc=$?"; grep -E "PASSED|FAILED" "$L/golden.txt" | head -5; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print({k: (round(v,3) if isinstance(v,float) else v) for k,v in r.items()})" 2>&1 | cut -c1-900; pack
el dsa; timeout 90 $D/bin/moetrain bench dsa --tokens 8192,32768 --iters 3 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa.json'))['runs']: print({k: (round(v,2) if isinstance(v,float) else v) for k,v in r.items() if 'ms' in k or k in ('tokens','mqa_kernels')})" 2>&1 | cut -c1-1500; pack
el racecheck; timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa*' --gtest_brief=1 > "$L/racecheck.txt" 2>&1; echo "rc=$?"; grep -E "RACECHECK SUMMARY|tests ran|FAILED" "$L/racecheck.txt" | head -4
timeout 45 compute-sanitizer --tool synccheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa*' --gtest_brief=1 > "$L/synccheck.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|tests ran|FAILED" "$L/synccheck.txt" | head -4; pack
el moe; timeout 120 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform,B:uniform --iters 1 --warmup 0 > "$L/ncu_moe.csv" 2> "$L/ncu_moe.err"; echo "rc=$?"; pack
el mqa; timeout 100 ncu --kernel-name regex:mqa_bwd_kernel --launch-count 1 --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats --section SchedulerStats --metrics lts__t_requests_op_red.sum,lts__t_sectors_op_red.sum,smsp__inst_executed_op_global_red.sum $D/bin/moetrain bench dsa --tokens 8192 --iters 1 > "$L/ncu_mqa.txt" 2>&1; echo "rc=$?"; pack
el mqafwd; timeout 60 ncu --kernel-name regex:mqa_fwd_kernel --launch-count 1 --section WarpStateStats --section Occupancy --section ComputeWorkloadAnalysis --section LaunchStats --section SchedulerStats $D/bin/moetrain bench dsa --tokens 8192 --iters 1 > "$L/ncu_mqafwd.txt" 2>&1; echo "rc=$?"; pack
el kdancu; timeout 70 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.err"; echo "rc=$?"; pack
el done
