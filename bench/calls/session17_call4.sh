#!/usr/bin/env bash
# Session 17, call 4 (issue 14): out_grads_kernel with each thread's copy addresses formed once
# (call 3's ncu: ALU the busiest pipe, 2.0 TB/s): its tests, its time per launch, bench moe.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaLoraGrouped.*:CudaGroupedFfn.*:*CudaMoe*:CudaGroupedMatmul*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
el ncu; timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum --kernel-name regex:'out_grads_kernel|down_kernel|dw_kernel' --csv $D/bin/moetrain bench moe --cases A:uniform,B:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu.csv" 2> "$L/ncu.err"; echo "ncu rc=$?"
python3 - "$L/ncu.csv" <<'PY' 2>&1 | tail -30
import csv, sys, re, collections
rows = list(csv.reader(open(sys.argv[1], errors='replace')))
s = next(i for i, r in enumerate(rows) if r and r[0] == 'ID')
h = rows[s]; ki, mi, vi = h.index('Kernel Name'), h.index('Metric Name'), h.index('Metric Value')
k = collections.OrderedDict()
for r in rows[s + 1:]:
    if len(r) > vi: k.setdefault((r[0], re.sub(r'\(.*', '', r[ki])[-40:]), {})[r[mi]] = float(r[vi].replace(',', ''))
for (i, n), m in k.items():
    t = m.get('gpu__time_duration.sum', 0) / 1e3
    print(i, n, '%.1f us' % t, '%.2f TB/s' % (m.get('dram__bytes_read.sum', 0) / (t * 1e-6) / 1e12 if t else 0), 'inst %.1fM' % (m.get('smsp__inst_executed.sum', 0) / 1e6))
PY
pack
el moe; timeout 90 $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch
pack
el done
