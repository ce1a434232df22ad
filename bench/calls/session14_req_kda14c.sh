set -u
: "${D:?}" "${L:?}"
# kda14c: KDA backward products v2 (persistent, three jobs merged, cp.async ring; 942a77d, in mid14) and,
# where the build has it (branch kda14c at a3677ad, not in mid14 at 65a45f9), prep v2 (L2 prefetch of the
# block 2 x SMs ahead; bench field fwd_ms_prep_v1, test setup *_prepV1). Expected: all CudaKdaTc pass (products v2 vs v1:
# forward outputs 0, gradients << bound; prep v1 vs v2: 0), racecheck 0 hazards on products_v2_kernel,
# bench fwdbwd_ms below fwdbwd_ms_products_v1 by ~0.5 ms at B2 T8192; fwd_ms vs fwd_ms_prep_v1 unknown.
timeout 60 $D/bin/gpu_suite --gtest_filter='*CudaKdaTc*' > "$L/suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite.txt" | head -20; grep -h "products" "$L/suite.txt" | head -12
timeout 30 compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=products_v2 $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T250_docs2_h0_dhT_mild' > "$L/racecheck.txt" 2>&1; echo "racecheck rc=$?"
grep -E "RACECHECK SUMMARY|PASSED|FAILED|rror" "$L/racecheck.txt" | head -5
timeout 40 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json; j=json.load(open('$L/bench_kda.json'))
def walk(o):
    if isinstance(o, dict):
        if 'fwdbwd_ms' in o: print(o.get('case'), {k: round(v, 3) for k, v in o.items() if k.startswith(('fwd', 'gate')) and isinstance(v, float)})
        else: [walk(v) for v in o.values()]
    elif isinstance(o, list): [walk(v) for v in o]
walk(j)" 2>&1 | tail -4
# per launch: products_v2 / products_tc (v1) and prep_tc (v2 first, the fwd_ms_prep_v1 block later)
timeout 45 ncu --kernel-name regex:"products|prep_tc" --launch-count 45 --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda14c.csv" 2>&1; echo "ncu rc=$?"
python3 -c "
import csv, re
rows = {}
for r in csv.reader(open('$L/ncu_kda14c.csv')):
    if len(r) > 14 and r[0].isdigit(): rows.setdefault((int(r[0]), re.sub(r'.*::(?=[a-z0-9_]+_kernel)', '', r[4].split('(')[0])), {})[r[12]] = r[14]
for (i, n), m in sorted(rows.items()): print(i, n, ' '.join(m.values()))" 2>&1 | head -45
