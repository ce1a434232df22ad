#!/usr/bin/env bash
# Session 11, call 3 (kda11 merged: bf16 prepared block, output fused into the forward state pass;
# the sorted embedding backward): KDA, embedding and model device tests, bench kda (bf16 and f32
# prepared blocks) and fla's chunk_kda in the same call, compute-sanitizer memcheck + racecheck
# over the KDA tensor-core kernels, ncu of bench kda, the two-layer DSA model at 131072 again.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaKda*:KdaChunkLayout*:CudaModel*:CudaEmbedding*:CudaNorm*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite.txt" | head -20; grep -h "fp32 block" "$L/suite.txt" | head -8; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
timeout 60 $D/bin/moetrain bench kda --prepared f32 --json "$L/bench_kda_f32.json" > "$L/kda_f32.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for f in ['bench_kda', 'bench_kda_f32']:
  for r in json.load(open('$L/'+f+'.json'))['runs']: print(f, r['case'], 'fwd %.2f fwdbwd %.2f'%(r['fwd_ms'],r['fwdbwd_ms']), r.get('prepared_layout'), 'launches', r.get('launches_fwd'), r.get('launches_bwd'), r.get('launches_fwd_error','')[:80], 'saved %.2f'%r.get('saved_for_backward_gib',0))" 2>&1 | tail -8; pack
el fla; python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > "$L/pip.log" 2>&1 || tail -3 "$L/pip.log"
timeout 240 python3 bench/kda_fla.py > "$L/kda_fla.jsonl" 2> "$L/kda_fla.err"; echo "fla rc=$?"; cut -c1-400 "$L/kda_fla.jsonl"; tail -2 "$L/kda_fla.err"; pack
el memcheck; timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaKdaTc*:CudaEmbedding*' --gtest_brief=1 > "$L/memcheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|FAILED" "$L/memcheck.txt" | head -5; pack
el racecheck; timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaKdaTc.ForwardBackward*' --gtest_brief=1 > "$L/racecheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED" "$L/racecheck.txt" | head -5; pack
el ncu kda; timeout 60 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.log"; echo "rc=$?"; pack
el done
