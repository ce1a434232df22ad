#!/usr/bin/env bash
# Session 14, call 3 (final; one start left in the device budget, so everything in one call): main
# with every helper's branch merged (KDA: grads v2, products v2, prep v2 / kda14d, kda14e; moe14's
# expert-LoRA kernels joined into the SwiGLU passes; dsa14's wgmma sparse MQA forward). Device
# tests and goldens, bench kda / moe / dsa, torch._grouped_mm in the same call, fla's chunk_kda
# short cases last (its autotuning takes minutes), racecheck over the joined SwiGLU kernels if
# time is left.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 130 $D/bin/gpu_suite --gtest_filter='*Kda*:CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*:*CudaModel*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite.txt" | head -24; pack
timeout 110 $D/bin/gpu_suite --gtest_filter='*CudaSparseMqa*:*CudaDsa*' > "$L/suite_dsa.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite_dsa.txt" | head -12; pack
timeout 30 $D/bin/test_golden --gtest_filter='GoldenCuda.*' > "$L/golden.txt" 2>&1; echo "golden rc=$?"; grep -E "PASSED|FAILED" "$L/golden.txt" | head -3; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], {k: round(v,3) for k,v in r.items() if isinstance(v,float) and 'ms' in k})" 2>&1 | cut -c1-800; pack
el moe; timeout 70 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
python3 - "$L" <<'PY' 2>&1 | tail -12
import json, sys
L = sys.argv[1]
t = {(x['case'], x['routing']): x for x in map(json.loads, [l for l in open(L + '/moe_torch.jsonl') if l.startswith('{')])}
for r in json.load(open(L + '/bench_moe.json'))['runs']:
    a = t[(r['case'], r['routing'])]
    print(r['case'], r['routing'], 'fwd %.2f (%.2fx) frozen %.2f (%.2fx) written %.2f (%.2fx) lora %.2f (+%.1f%%; s13 kernels %.2f) graph frozen %.2f' % (
        r['fwd_ms'], a['fwd_ms'] / r['fwd_ms'], r['fwdbwd_frozen_ms'], a['fwdbwd_frozen_ms'] / r['fwdbwd_frozen_ms'],
        r['fwdbwd_full_written_ms'], a['fwdbwd_full_ms'] / r['fwdbwd_full_written_ms'], r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'],
        r.get('lora_s13_fwdbwd_ms', 0), r.get('graph_fwdbwd_frozen_ms', 0)))
PY
pack
el dsa; timeout 50 $D/bin/moetrain bench dsa --tokens 8192 --iters 3 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa.json'))['runs']: print({k: (round(v,2) if isinstance(v,float) else v) for k,v in r.items() if 'ms' in k or k in ('T','mqa_kernels')})" 2>&1 | cut -c1-900; pack
el prep racecheck; timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=prep_tc $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T250_docs2_h0_dhT_mild' > "$L/racecheck_prep.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_prep.txt" | head -3; pack
left=$(( 530 - ($(date +%s) - t0) )); el "fla (${left}s left)"
if [ "$left" -gt 100 ]; then
  python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
  timeout $(( left - 5 )) python3 bench/kda_fla.py --skip-long > "$L/fla.jsonl" 2> "$L/fla.err"; echo "fla rc=$?"
  cut -c1-300 "$L/fla.jsonl"; pack
fi
left=$(( 545 - ($(date +%s) - t0) ))
if [ "$left" -gt 40 ]; then
  el racecheck; timeout $(( left - 5 )) compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaLoraGrouped.FusedSwigluKernelsAgainstTheCpuComposites' > "$L/racecheck_moe.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_moe.txt" | head -3; pack
fi
el done
