#!/usr/bin/env bash
# Session 13, call 3: right after call 2 on the same machine and binaries, our KDA core then fla
# 0.6.0's chunk_kda (the short cases; fla autotunes on a fresh machine, outside its timings).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
$D/bin/moetrain bench kda --json "$OUT/kda.json" > /dev/null 2>&1
python3 -c "
import json
for r in json.load(open('$OUT/kda.json'))['runs']: print(r['case'], 'fwd %.3f eval %.3f fwdbwd %.3f gate+core %.3f / %.3f'%(r['fwd_ms'],r['fwd_eval_ms'],r['fwdbwd_ms'],r['gate_core_fwd_ms'],r['gate_core_fwdbwd_ms']))"
python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
timeout 290 python3 bench/kda_fla.py --skip-long > "$OUT/fla.jsonl" 2> "$OUT/fla.err"; echo "fla rc=$?"
cut -c1-300 "$OUT/fla.jsonl"
