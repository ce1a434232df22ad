#!/usr/bin/env bash
# Session 14, call 3: main with moe14 (expert-LoRA kernels joined into the SwiGLU passes) and dsa14
# (the wgmma sparse MQA forward) merged, before the KDA helpers' last changes: the MoE and sparse
# MQA device tests, racecheck over the joined SwiGLU kernels, bench moe with torch._grouped_mm in
# the same call, bench dsa at 8K. KDA and the fla anchor follow in call 4.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='*CudaSparseMqa*:CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite.txt" | head -30; pack
el racecheck; timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaLoraGrouped.FusedSwigluKernelsAgainstTheCpuComposites:CudaGroupedFfn.LoraBackwardOnePassOverDout' > "$L/racecheck_moe.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_moe.txt" | head -3; pack
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
el dsa; timeout 60 $D/bin/moetrain bench dsa --tokens 8192 --iters 3 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa.json'))['runs']: print({k: (round(v,2) if isinstance(v,float) else v) for k,v in r.items() if 'ms' in k or k in ('T','mqa_kernels')})" 2>&1 | cut -c1-900; pack
el done
