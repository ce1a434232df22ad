#!/usr/bin/env bash
# Session 16, call 4 (final): main with kda16 (bf16 chunk states, no prepared blocks kept, bwd_pre
# folded into the backward's prep), lora16 (expert-LoRA kernels per pass) and swiglu16 (SwiGLU
# epilogues, off by default) merged. Issue 12's figures first (bench kda, fla in the same call, our
# core against fla on the same inputs, the KDA tests), then issue 14's (the MoE tests, bench moe
# with torch._grouped_mm, the SwiGLU epilogues' timings), the steps, the sanitizers.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=560
left() { echo $(( budget - ($(date +%s) - t0) )); }
el kda; timeout 60 $D/bin/moetrain bench kda --iters 5 --warmup 1 --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k.startswith(('fwd_ms', 'fwd_eval_ms', 'fwdbwd_ms', 'gate_core', 'saved', 'launches'))})" 2>&1 | cut -c1-1500; pack
python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
fla_cache_restore
el fla; timeout 100 python3 bench/kda_fla.py --autotune-cache "$FLA_CACHE" --cases B2_T8192,B1_T65536,packed16_T16384,B2_T8192_gate > "$L/fla.jsonl" 2> "$L/fla.err"; echo "fla rc=$?"
grep "^{" "$L/fla.jsonl" | cut -c1-400; pack
el fla_same_inputs; timeout 60 python3 bench/kda_fla.py --autotune-cache "$FLA_CACHE" --dump /tmp/kda_fla.safetensors > "$L/fla_dump.out" 2> "$L/fla_dump.err"; echo "dump rc=$?"
MOETRAIN_FLA_KDA=/tmp/kda_fla.safetensors timeout 40 $D/bin/gpu_suite --gtest_filter='CudaKdaFla.*' > "$L/suite_kda_fla.txt" 2>&1; echo "rc=$?"
grep -E "kda vs fla|vs float64|^\[  (PASSED|FAILED)|Failure" "$L/suite_kda_fla.txt" | head -12; fla_cache_save; pack
el test_kda; ( . bench/calls/session16_final_kda16.sh ) ; pack
el test_moe; timeout 110 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul*:CudaGroupedGemmConfig.*' > "$L/suite_moe.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite_moe.txt" | head -12; pack
el moe; timeout 60 $D/bin/moetrain bench moe --iters 5 --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
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
el steps; timeout 45 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"; step_line "$L/step.json"
timeout 45 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
l=$(left); el "swiglu (${l}s left)"
if [ "$l" -gt 50 ]; then
  timeout 45 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --base-only --iters 5 --gemm coop128x256c2x1,coop128x256c2x1:swiglu=bwd,coop128x256c2x1:swiglu=fwd,coop128x256c2x1:swiglu --json "$L/swiglu.json" > "$L/swiglu.txt" 2>&1; echo "rc=$?"
  python3 -c "
import json
for r in json.load(open('$L/swiglu.json'))['runs']: print(r['case'], r['grouped_gemm'], {k: round(v, 3) for k, v in r.items() if k.endswith('_ms')})" 2>&1 | tail -8; pack
fi
l=$(left); el "sanitizers (${l}s left)"
if [ "$l" -gt 40 ]; then
  timeout 30 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaLoraGrouped.FusedSwigluKernelsAgainstTheCpuComposites' > "$L/racecheck_lora.txt" 2>&1; echo "racecheck lora rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_lora.txt" | head -3
  timeout 35 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2K128V128_T300_docs1_h0_dhT_strong' > "$L/memcheck_kda.txt" 2>&1; echo "memcheck kda rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$L/memcheck_kda.txt" | head -3; pack
fi
el done
