#!/usr/bin/env bash
# Session 23, call 6 (issue 14): main's binary (1c93a10) with the LoRA run's xa and dr kernels
# switched (`bench moe --lora-xa staged`: the skinny X A^T kernel, then the K + r gate/up GEMM;
# `--lora-dr staged`: the out_grads pass forms dr and dB, then the K + r down dX GEMM) against the
# fused GEMMs, at B uniform, B skewed and A skewed, each under the kernel tracer.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
unpack_main
T=$PWD/.gpu/trace
run() {  # case tag args...
  local c=$1 tag=$2; shift 2
  el "$c $tag"
  MT_KERNEL_TRACE=$L/trace_${c/:/_}_$tag.csv LD_PRELOAD=$T/libkernel_trace.so LD_LIBRARY_PATH=$T:$LD_LIBRARY_PATH \
    timeout 60 $D/bin/moetrain_main bench moe --cases $c --iters 10 --lora-variants none --json "$L/moe_${c/:/_}_$tag.json" "$@" > "$L/moe_${c/:/_}_$tag.txt" 2>&1; echo "rc=$?"
  python3 "$T/summarize.py" "$L/trace_${c/:/_}_$tag.csv" --detail --gap-us 20 > "$L/sum_${c/:/_}_$tag.txt" 2>&1; pack
}
for c in B:uniform B:skewed; do
  run $c fused
  run $c xa_staged --lora-xa staged
  run $c dr_staged --lora-dr staged
  run $c both_staged --lora-xa staged --lora-dr staged
done
run A:skewed fused
run A:skewed xa_staged --lora-xa staged
run A:skewed dr_staged --lora-dr staged
python3 - "$L" <<'PY'
import json, sys, glob, os
L = sys.argv[1]
for f in sorted(glob.glob(f'{L}/moe_*.json')):
    try:
        r = json.load(open(f))['runs'][0]
    except Exception as e:
        print(os.path.basename(f), e); continue
    print(os.path.basename(f)[4:-5], 'frozen', round(r['fwdbwd_frozen_ms'], 3), 'lora fwd', round(r['lora_fwd_ms'], 3), 'lora', round(r['lora_fwdbwd_ms'], 3), 'median', round(100 * r['lora_overhead_fwdbwd_median'], 1),
          'rounds', [round(v, 2) for v in r['fwdbwd_frozen_rounds_ms']], [round(v, 2) for v in r['lora_fwdbwd_rounds_ms']])
PY
pack
el done
