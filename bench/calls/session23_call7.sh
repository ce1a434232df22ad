#!/usr/bin/env bash
# Session 23, call 7 (issue 14): main's binary (1c93a10), every offered LoRA kernel variant
# (`bench moe --lora-variants all`: SwiGLU forward / backward, out_grads, xa, dr, one pass at a
# time) at B uniform and B skewed, to see whether the back-to-back run ranks them as ncu did.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
unpack_main
for c in B:uniform B:skewed; do
  el "$c"
  timeout 150 $D/bin/moetrain_main bench moe --cases $c --iters 20 --lora-variants all --json "$L/moe_${c/:/_}.json" > "$L/moe_${c/:/_}.txt" 2>&1; echo "rc=$?"; pack
done
python3 - "$L" <<'PY'
import json, sys, glob, os
L = sys.argv[1]
for f in sorted(glob.glob(f'{L}/moe_*.json')):
    r = json.load(open(f))['runs'][0]
    print(os.path.basename(f)[4:-5], 'frozen', round(r['fwdbwd_frozen_ms'], 3), 'lora', round(r['lora_fwdbwd_ms'], 3), '(+%.1f%%)' % (100 * r['lora_overhead_fwdbwd']), 'median of rounds +%.1f%%' % (100 * r['lora_overhead_fwdbwd_median']))
    for k in sorted(r):
        if k.endswith('_overhead_fwdbwd') and k.startswith('lora_') and k != 'lora_overhead_fwdbwd':
            base = k[:-len('_overhead_fwdbwd')]
            print('   %-28s fwd %.3f fwdbwd %.3f (+%.1f%%)' % (base, r.get(base + '_fwd_ms', float('nan')), r.get(base + '_fwdbwd_ms', float('nan')), 100 * r[k]))
PY
pack
el done
