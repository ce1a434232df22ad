set -u
: "${D:?}" "${L:?}"
# kda14b: branch kda14b at 4faf791 (build that commit; see URGENT-kda14b.md about .deps): grads_v2_kernel, the KDA gradient
# kernel with every pair sum on tensor cores. Run from the repository root with the packed
# binaries in $D/bin, logs to $L/. About 80 s of device time; drop step 3 first if short.
# 1. Correctness (~30-40 s): the head_k 128 setups of CudaKdaTc (v2 the default; the _gradsV1 ones
#    run v1 first, v2 as "other"): both against the CPU, and the v2-v1 gap ("grads v2 vs v1").
timeout 60 $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.*K128*-*stateV1*:*StateV1*' > "$L/kda14b_tc.txt" 2>&1; echo "tc rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|Which is|grads v2 vs v1" "$L/kda14b_tc.txt" | grep -E "FAILED|PASSED|Failure|seed|Which|dq |dk |dg |dbeta" | head -40
# 2. Timing (~25 s): fwdbwd_ms (grads v2) against fwdbwd_ms_grads_v1 in one run, every case.
timeout 45 $D/bin/moetrain bench kda --json "$L/kda14b_bench.json" > "$L/kda14b_bench.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
for r in json.load(open('$L/kda14b_bench.json'))['runs']: print(r['case'], 'fwdbwd %.3f (grads v1 %.3f) fwd %.3f'%(r['fwdbwd_ms'], r['fwdbwd_ms_grads_v1'], r['fwd_ms']))"
# 3. Per launch (~20 s): the gradient kernels only, first case (B2 T8192): 6 v2 launches, then 3 v1.
timeout 40 ncu -k regex:grads --launch-count 9 --metrics gpu__time_duration.sum,dram__bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active --csv $D/bin/moetrain bench kda --iters 1 > "$L/kda14b_ncu.csv" 2> "$L/kda14b_ncu.err"; echo "ncu rc=$?"
grep -E "grads" "$L/kda14b_ncu.csv" | awk -F'","' '{print $5, $13, $15}' | cut -c1-200 | head -30
