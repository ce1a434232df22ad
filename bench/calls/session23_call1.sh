#!/usr/bin/env bash
# Session 23, calls 1-2 (issue 14): main 1c93a10's first run on the device (the fused GEMMs' scratch
# sizing without the occupancy query): the CUDA graph and grouped FFN tests. Then `bench moe` at B
# and A uniform under the kernel tracer (tools/kernel_trace): every kernel's time in the
# back-to-back run, beside ncu's isolated times, and nvidia-smi's SM clock and power through it. Call 1 ran the tracer by
# CUDA_INJECTION64_PATH from a folder that was not there (tools/kernel_trace/build.sh's relative
# path): no trace; call 2 loads it by LD_PRELOAD.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=300
if [ -z "${SKIP_TESTS:-}" ]; then el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGraph.*:CudaGroupedFfn.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack; fi
T=$PWD/.gpu/trace
TZ=UTC nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader -lms 100 > "$L/smi.csv" 2>&1 &
smi=$!
for c in B A; do
  el "trace $c"
  MT_KERNEL_TRACE=$L/trace_$c.csv LD_PRELOAD=$T/libkernel_trace.so LD_LIBRARY_PATH=$T:$LD_LIBRARY_PATH \
    timeout 90 $D/bin/moetrain bench moe --cases $c:uniform --iters 10 --lora-variants none --json "$L/moe_$c.json" > "$L/moe_$c.txt" 2>&1; echo "rc=$?"
  wc -l "$L/trace_$c.csv"; python3 "$T/summarize.py" "$L/trace_$c.csv" --smi "$L/smi.csv" --detail > "$L/sum_$c.txt" 2>&1; grep -c burst "$L/sum_$c.txt"; pack
done
kill $smi
nvidia-smi -q -d PERFORMANCE,POWER > "$L/smi_q.txt" 2>&1
awk -F', ' '{print $2, $4}' "$L/smi.csv" | sort | uniq -c | sort -rn | head -8
python3 - "$L" <<'PY'
import json, sys
L = sys.argv[1]
for c in 'BA':
    try:
        r = json.load(open(f'{L}/moe_{c}.json'))['runs'][0]
    except Exception as e:
        print(c, e); continue
    print(c, 'frozen', round(r['fwdbwd_frozen_ms'], 3), 'lora', round(r['lora_fwdbwd_ms'], 3), 'median', round(100 * r['lora_overhead_fwdbwd_median'], 1),
          'rounds', [round(v, 2) for v in r['fwdbwd_frozen_rounds_ms']], [round(v, 2) for v in r['lora_fwdbwd_rounds_ms']])
PY
pack
el done
