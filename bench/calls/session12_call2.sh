#!/usr/bin/env bash
# Session 12, call 2: main with the dW hint (weight_grads_zero), the evaluation forward of the KDA
# core (keep_for_backward), the gate + core timing, and lora12 (the skinny LoRA kernels through a
# cp.async ring): their device tests and the GPU goldens (moetrain forward now runs Pass::Eval),
# compute-sanitizer over the changed kernels, bench moe with torch._grouped_mm in the same call,
# bench kda, the expert-LoRA and default steps, and fla's chunk_kda (the short cases, with the time
# left: the calls before this one were refused and took device time).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 170 $D/bin/gpu_suite --gtest_filter='*CudaKda*:CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=" "$L/suite.txt" | head -24; pack
timeout 60 $D/bin/test_golden --gtest_filter='GoldenCuda.*' > "$L/golden.txt" 2>&1; echo "golden rc=$?"; grep -E "PASSED|FAILED" "$L/golden.txt" | head -5; pack
el moe; timeout 90 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
python3 - "$L" <<'PY' 2>&1 | tail -6
import json, sys
L = sys.argv[1]
t = {(x['case'], x['routing']): x for x in map(json.loads, [l for l in open(L + '/moe_torch.jsonl') if l.startswith('{')])}
for r in json.load(open(L + '/bench_moe.json'))['runs']:
    a = t[(r['case'], r['routing'])]
    print(r['case'], r['routing'], 'fwd %.2f (%.2fx) frozen %.2f (%.2fx) full %.2f (%.2fx) written %.2f (%.2fx) lora %.2f (+%.1f%%) gathered +%.1f%%' % (
        r['fwd_ms'], a['fwd_ms'] / r['fwd_ms'], r['fwdbwd_frozen_ms'], a['fwdbwd_frozen_ms'] / r['fwdbwd_frozen_ms'],
        r['fwdbwd_full_ms'], a['fwdbwd_full_ms'] / r['fwdbwd_full_ms'], r['fwdbwd_full_written_ms'], a['fwdbwd_full_ms'] / r['fwdbwd_full_written_ms'],
        r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], 100 * r.get('gathered_lora_overhead_fwdbwd', 0)))
PY
pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], 'fwd %.2f eval %.2f fwdbwd %.2f gate+core %.2f / %.2f'%(r['fwd_ms'],r['fwd_eval_ms'],r['fwdbwd_ms'],r['gate_core_fwd_ms'],r['gate_core_fwdbwd_ms']))" 2>&1 | tail -4; pack
el memcheck; timeout 55 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaLoraGrouped.*:CudaGroupedFfn.WeightGrads*:CudaGroupedFfn.LoraBackwardOnePassOverDout:*CudaKdaEval*' --gtest_brief=1 > "$L/memcheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|FAILED|tests ran" "$L/memcheck.txt" | head -5; pack
el racecheck; timeout 35 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.LoraBackwardOnePassOverDout' > "$L/racecheck.txt" 2>&1; echo "rc=$?"
grep -E "RACECHECK SUMMARY|tests ran|PASSED|FAILED" "$L/racecheck.txt" | head -4; pack
el step experts; timeout 75 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
el step; timeout 65 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"; step_line "$L/step.json"; pack
left=$(( 520 - ($(date +%s) - t0) )); el "fla (${left}s left)"
if [ "$left" -gt 60 ]; then
  python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > "$L/pip.log" 2>&1 || tail -3 "$L/pip.log"
  timeout $(( left - 5 )) python3 bench/kda_fla.py --skip-long > "$L/kda_fla.jsonl" 2> "$L/kda_fla.err"; echo "fla rc=$?"; cut -c1-330 "$L/kda_fla.jsonl"; tail -2 "$L/kda_fla.err"; pack
fi
el done
