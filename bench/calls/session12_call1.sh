#!/usr/bin/env bash
# Session 12, call 1: the three branches prepared in session 11 (dsa12: KL target inside the sparse
# MQA backward; kda12: restructured tensor-core prep; moe12: fused expert-LoRA passes), merged into
# one tree and validated together: their device tests, compute-sanitizer racecheck/memcheck over
# the changed kernels, bench kda / dsa / moe with torch._grouped_mm in the same call, ncu of the
# changed kernels.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
dsa_rows() { python3 -c "
import json
for r in json.load(open('$1'))['runs']: print({k:(round(v,2) if isinstance(v,float) else v) for k,v in r.items()})" 2>&1 | cut -c1-1200; }
el test; timeout 200 $D/bin/gpu_suite --gtest_filter='*CudaKda*:KdaChunkLayout*:*CudaSparseMqa*:*CudaModel*:*CudaDsaLong*:*CudaIndexer*:*CudaDsa*:CudaGroupedFfn.*:CudaDispatch.*:CudaLoraGrouped.*:CudaGroupedGemmConfig.*:*CudaMoe*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite.txt" | head -24; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], 'fwd %.2f fwdbwd %.2f'%(r['fwd_ms'],r['fwdbwd_ms']), 'launches', r.get('launches_fwd'), r.get('launches_bwd'), 'saved %.2f'%r.get('saved_for_backward_gib',0))" 2>&1 | tail -8; pack
el dsa; timeout 60 $D/bin/moetrain bench dsa --tokens 8192,32768 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"; dsa_rows "$L/bench_dsa.json"; pack
el moe; timeout 120 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"; tail -14 "$L/moe.txt" | cut -c1-400
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"; pack
el racecheck; timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='*CudaKdaTcPrepared.BlockIsComplete*' > "$L/racecheck.txt" 2>&1; echo "rc=$?"
grep -E "RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$L/racecheck.txt" | head -4; pack
el memcheck; timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='*CudaKdaTc*:*KConcat*:*FusedPass*:*GatherProjectFused*:*SwigluFused*:*CudaSparseMqa*' --gtest_brief=1 > "$L/memcheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|FAILED|tests ran" "$L/memcheck.txt" | head -5; pack
el ncu; timeout 50 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.log"; echo "rc=$?"; pack
timeout 50 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench dsa --tokens 8192 --iters 1 > "$L/ncu_dsa.csv" 2> "$L/ncu_dsa.log"; echo "rc=$?"; pack
timeout 50 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform,B:uniform --iters 1 --warmup 1 > "$L/ncu_moe.csv" 2> "$L/ncu_moe.log"; echo "rc=$?"; pack
el done
