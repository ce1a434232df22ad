#!/usr/bin/env bash
# Session 14, call 3 (final): main with the helpers' branches merged (kda14b grads v2, kda14c
# products v2 and the prep, moe14 expert LoRA, dsa14 wgmma sparse MQA forward): device tests and
# goldens, bench kda / moe / dsa with their anchors in the same call (torch._grouped_mm, fla's
# chunk_kda short cases last: its autotuning takes minutes), the step at 8K.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 200 $D/bin/gpu_suite --gtest_filter='*Kda*:*CudaSparseMqa*:*CudaDsa*:*CudaModel*:CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*:*CudaDecode*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite.txt" | head -30; pack
timeout 40 $D/bin/test_golden --gtest_filter='GoldenCuda.*' > "$L/golden.txt" 2>&1; echo "golden rc=$?"; grep -E "PASSED|FAILED" "$L/golden.txt" | head -3; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], {k: round(v,3) for k,v in r.items() if isinstance(v,float)})" 2>&1 | cut -c1-700; pack
el moe; timeout 70 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
python3 - "$L" <<'PY' 2>&1 | tail -12
import json, sys
L = sys.argv[1]
t = {(x['case'], x['routing']): x for x in map(json.loads, [l for l in open(L + '/moe_torch.jsonl') if l.startswith('{')])}
for r in json.load(open(L + '/bench_moe.json'))['runs']:
    a = t[(r['case'], r['routing'])]
    print(r['case'], r['routing'], 'fwd %.2f (%.2fx) frozen %.2f (%.2fx) written %.2f (%.2fx) lora %.2f (+%.1f%%)' % (
        r['fwd_ms'], a['fwd_ms'] / r['fwd_ms'], r['fwdbwd_frozen_ms'], a['fwdbwd_frozen_ms'] / r['fwdbwd_frozen_ms'],
        r['fwdbwd_full_written_ms'], a['fwdbwd_full_ms'] / r['fwdbwd_full_written_ms'], r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd']))
PY
pack
el dsa; timeout 60 $D/bin/moetrain bench dsa --tokens 8192 --iters 3 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa.json'))['runs']: print({k: (round(v,2) if isinstance(v,float) else v) for k,v in r.items() if 'ms' in k or k in ('T','mqa_kernels')})" 2>&1 | cut -c1-900; pack
el step; timeout 65 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"; step_line "$L/step.json"; pack
left=$(( 560 - ($(date +%s) - t0) )); el "fla (${left}s left)"
if [ "$left" -gt 120 ]; then
  python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
  timeout $(( left - 5 )) python3 bench/kda_fla.py --skip-long > "$L/fla.jsonl" 2> "$L/fla.err"; echo "fla rc=$?"
  cut -c1-300 "$L/fla.jsonl"; pack
fi
el done
