#!/usr/bin/env bash
# Session 15, call 3 (final; ~560 s of device budget left): main with the helpers' branches merged
# (kda15's overlapped forward and longest-first state passes, moe15's dW / down kernels and kept h,
# dsa15's wgmma backward as a selectable generation: its tile-edge tests and racecheck). bench kda
# first (issue 12's figures), the KDA tests, our core against fla on the same inputs (kda_fla.py --dump, packed case: its tuning is
# cached), the MoE tests and bench moe with torch._grouped_mm, bench dsa, racecheck / memcheck over
# the overlapped forward, then fla's B2 T8192 / T65536 timings (their tuning continued) in the rest.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=425
left() { echo $(( budget - ($(date +%s) - t0) )); }
el kda; timeout 45 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], {k: round(v,3) for k,v in r.items() if isinstance(v,float) and ('ms' in k or 'gib' in k)})" 2>&1 | cut -c1-900; pack
el test_kda; timeout 115 $D/bin/gpu_suite --gtest_filter='*Kda*' > "$L/suite_kda.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite_kda.txt" | head -16; pack
python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
fla_cache_restore
el fla_same_inputs; timeout 60 python3 bench/kda_fla.py --autotune-cache "$FLA_CACHE" --dump /tmp/kda_fla.safetensors > "$L/fla_dump.out" 2> "$L/fla_dump.err"; echo "dump rc=$?"; grep "kda_fla" "$L/fla_dump.err" | tail -3
MOETRAIN_FLA_KDA=/tmp/kda_fla.safetensors timeout 40 $D/bin/gpu_suite --gtest_filter='CudaKdaFla.*' > "$L/suite_kda_fla.txt" 2>&1; echo "rc=$?"
grep -E "kda vs fla|^\[  (PASSED|FAILED)|Failure" "$L/suite_kda_fla.txt" | head -12; pack
el test_moe; timeout 75 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*:CudaGroupedGemmConfig.*' > "$L/suite_moe.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite_moe.txt" | head -12; pack
el moe; timeout 50 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 50 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
python3 - "$L" <<'PY' 2>&1 | tail -12
import json, sys
L = sys.argv[1]
t = {(x['case'], x['routing']): x for x in map(json.loads, [l for l in open(L + '/moe_torch.jsonl') if l.startswith('{')])}
for r in json.load(open(L + '/bench_moe.json'))['runs']:
    a = t[(r['case'], r['routing'])]
    print(r['case'], r['routing'], 'fwd %.2f (%.2fx) frozen %.2f (%.2fx) written %.2f (%.2fx) keep_h %.2f (%.2fx) lora %.2f (+%.1f%%)' % (
        r['fwd_ms'], a['fwd_ms'] / r['fwd_ms'], r['fwdbwd_frozen_ms'], a['fwdbwd_frozen_ms'] / r['fwdbwd_frozen_ms'],
        r['fwdbwd_full_written_ms'], a['fwdbwd_full_ms'] / r['fwdbwd_full_written_ms'],
        r.get('fwdbwd_full_written_keep_h_ms', 0), a['fwdbwd_full_ms'] / r.get('fwdbwd_full_written_keep_h_ms', 1e9),
        r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd']))
PY
pack
el dsa; timeout 40 $D/bin/moetrain bench dsa --tokens 8192 --iters 3 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa.json'))['runs']: print({k: (round(v,2) if isinstance(v,float) else v) for k,v in r.items() if 'ms' in k or k in ('T','mqa_kernels')})" 2>&1 | cut -c1-900; pack
el test_dsa; timeout 45 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa.WgmmaTileEdges:CudaSparseMqa.PaddedHeadBlocks' > "$L/suite_mqa.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|Failure|seed=" "$L/suite_mqa.txt" | head -8
timeout 30 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa.SanitizerSizedWgmmaBackward' > "$L/racecheck_mqa.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_mqa.txt" | head -3; pack
# The overlapped forward on a small single-document case (2 heads: 8 state blocks, so the
# persistent prep and the flag-following state pass run): racecheck over the prep, memcheck whole.
kc='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2K128V128_T300_docs1_h0_dhT_strong'
el sanitizers; timeout 35 compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=prep_tc $D/bin/gpu_suite --gtest_filter="$kc" > "$L/racecheck_kda.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_kda.txt" | head -3
timeout 35 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter="$kc" > "$L/memcheck_kda.txt" 2>&1; echo "rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$L/memcheck_kda.txt" | head -3; pack
l=$(left); el "fla timings (${l}s left)"
if [ "$l" -gt 30 ]; then
  timeout "$l" python3 bench/kda_fla.py --autotune-cache "$FLA_CACHE" --cases B2_T8192,B1_T65536,B2_T8192_gate \
    > "$L/fla.jsonl" 2> "$L/fla.err"; echo "fla rc=$?"
  grep "^{" "$L/fla.jsonl" | cut -c1-300; grep "^\[" "$L/fla.err" | tail -4
fi
fla_cache_save; pack
el done
