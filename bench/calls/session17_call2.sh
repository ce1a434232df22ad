#!/usr/bin/env bash
# Session 17, call 2 (issue 14): the shape-dependent down-projection kernel, bench moe's alternating
# LoRA-overhead rounds and host-issue times, with nvidia-smi sampling the clocks and power beside
# it (why the wall times exceed the kernels' sum); the MoE and KDA device tests (the KDA runner moved
# into tests/cuda/kda_inputs.h).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 20 > "$L/smi.csv" 2>&1 &
smi=$!
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul*:CudaGroupedGemmConfig.*:Kda/CudaKda.*:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2K64V64*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
el moe; date +%H:%M:%S.%N; timeout 100 $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"; date +%H:%M:%S.%N
el torch; timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"; date +%H:%M:%S.%N
moe_vs_torch
kill $smi 2>/dev/null
python3 - "$L/smi.csv" <<'PY' 2>&1 | tail -30
import sys, collections
rows = [l.strip().split(', ') for l in open(sys.argv[1]) if l.count(',') >= 5]
# one line per second: min/max SM clock, mean power, the throttle reasons seen
by = collections.OrderedDict()
for r in rows:
    try:
        sec = r[0].split(' ')[1][:8]; clk = int(r[1].split()[0]); p = float(r[3].split()[0])
    except Exception:
        continue
    by.setdefault(sec, []).append((clk, p, r[5]))
for sec, v in by.items():
    cl = [c for c, _, _ in v]; pw = [p for _, p, _ in v]
    print(sec, 'sm MHz %d-%d' % (min(cl), max(cl)), 'W %.0f-%.0f' % (min(pw), max(pw)), sorted(set(x for _, _, x in v)))
PY
pack
el done
