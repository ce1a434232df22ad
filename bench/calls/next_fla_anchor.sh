#!/usr/bin/env bash
# For a coming session: fla 0.6.0's chunk_kda anchors, spread over calls if need be. Its Triton
# autotuning (minutes a case on a fresh machine; the packed cases' has never finished inside one
# call) is kept across calls: each call restores the *.autotune.json files the last one sent back
# and sends its own back ($OUT/fla_autotune.tgz; pack the next call with
# FLA_AUTOTUNE=<the returned fla_autotune.tgz> WHEELS=... tools/gpu.sh pack, and commit the file
# as bench/fla_autotune_h200.tgz once every case has finished, so later sessions start tuned).
# Our figures in the same call first (bench kda), then fla's cases, the packed ones first.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
$D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "kda rc=$?"; pack
python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
fla_cache_restore
timeout "${FLA_SECONDS:-420}" python3 bench/kda_fla.py --autotune-cache "$FLA_CACHE" \
  --cases "${FLA_CASES:-packed16_T16384,packed16_T16384_gate,B2_T8192,B2_T8192_gate,B1_T65536}" \
  > "$L/fla.jsonl" 2> "$L/fla.err"; echo "fla rc=$?"
cut -c1-300 "$L/fla.jsonl"; grep -E "autotuning|Triton autotuning" "$L/fla.err" | tail -20
fla_cache_save; pack
