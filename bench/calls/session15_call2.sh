#!/usr/bin/env bash
# Session 15, call 2 (mid-session): the helpers' first versions merged for measurement (branch
# mid15: kda15, moe15, dsa15), each helper's request script with its logs in its own folder; the
# grouped-FFN fix and the DSA layer's tests on Wgmma2 (the default since call 1); then fla's
# autotuning continued from call 1's (B2 T8192 first) in the time left.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el fix; timeout 70 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.KConcatLoraInTheBaseGemms:CudaDsa*' > "$L/suite_fix.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=|tests ran" "$L/suite_fix.txt" | head -12; pack
L0=$L
for n in kda15 moe15 dsa15; do
  [ -f "bench/calls/session15_req_$n.sh" ] || continue
  el "$n"; L=$L0/$n; mkdir -p "$L"; D=$D L=$L timeout 110 bash "bench/calls/session15_req_$n.sh" 2>&1 | tail -30; L=$L0; pack
done
python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
fla_cache_restore
left=$(( 430 - ($(date +%s) - t0) )); el "fla (${left}s left)"
if [ "$left" -gt 30 ]; then
  timeout "$left" python3 bench/kda_fla.py --autotune-cache "$FLA_CACHE" \
    --cases B2_T8192,B1_T65536,B2_T8192_gate,packed16_T16384_gate > "$L/fla.jsonl" 2> "$L/fla.err"
  echo "fla rc=$?"; grep "^{" "$L/fla.jsonl" | cut -c1-300; grep "^\[" "$L/fla.err" | tail -5
fi
fla_cache_save; pack
el done
