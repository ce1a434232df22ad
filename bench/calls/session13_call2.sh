#!/usr/bin/env bash
# Session 13, call 2 (final): main with kda13b (the second forward state pass), the separate fast
# decay gate with g formed again in backward, moe13 (per-form GEMM kernels, the SwiGLU backward in
# the dX epilogue behind :fuse, h written by SwiGLU's backward), dsa13: device tests and goldens,
# bench kda (v2 against v1 in the same run), the MoE configuration sweep with torch._grouped_mm in
# the same call, the steps, racecheck over the new state pass.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 170 $D/bin/gpu_suite --gtest_filter='*CudaKda*:*KdaGate*:CudaGroupedGemmConfig.*:CudaGroupedFfn.*:CudaGroupedMatmul.*:*CudaMoe*:*CudaModel*:CudaLoraGrouped.*:*CudaDecode*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|rel err.*v2 vs v1|state passes" "$L/suite.txt" | head -30; pack
timeout 50 $D/bin/test_golden --gtest_filter='GoldenCuda.*' > "$L/golden.txt" 2>&1; echo "golden rc=$?"; grep -E "PASSED|FAILED" "$L/golden.txt" | head -3; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], 'fwd %.3f (v1 %.3f) eval %.3f (v1 %.3f) fwdbwd %.3f gate+core %.3f / %.3f'%(r['fwd_ms'],r['fwd_ms_state_v1'],r['fwd_eval_ms'],r['fwd_eval_ms_state_v1'],r['fwdbwd_ms'],r['gate_core_fwd_ms'],r['gate_core_fwdbwd_ms']))" 2>&1 | tail -4; pack
el moe; timeout 120 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --base-only --iters 20 --gemm coop128x256c2x1,coop128x256c2x1:fuse,coop128x256c2x1:dx=pingpong128x128c2x1:fuse,coop128x256c2x1:dw=pingpong128x128c2x1,coop128x256c2x1:dw=pingpong128x128c1x1,coop128x256c2x1:dw=coop256x128c2x1,coop128x256c2x1:dw=coop128x256c1x2,coop128x256c2x1:fuse:dw=pingpong128x128c1x1 --json "$L/moe_sweep.json" > "$L/moe_sweep.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
python3 - "$L" <<'PY' 2>&1 | tail -20
import json, sys
L = sys.argv[1]
t = {(x['case'], x['routing']): x for x in map(json.loads, [l for l in open(L + '/moe_torch.jsonl') if l.startswith('{')])}
for k, a in t.items(): print('torch', k, 'fwd %.2f frozen %.2f full %.2f' % (a['fwd_ms'], a['fwdbwd_frozen_ms'], a['fwdbwd_full_ms']))
for r in json.load(open(L + '/moe_sweep.json'))['runs']:
    a = t[(r['case'], r['routing'])]
    print(r['case'], r.get('gemm', r.get('grouped_gemm', '?')), 'fwd %.2f (%.2fx) frozen %.2f (%.2fx) full %.2f written %.2f (%.2fx)' % (
        r['fwd_ms'], a['fwd_ms'] / r['fwd_ms'], r['fwdbwd_frozen_ms'], a['fwdbwd_frozen_ms'] / r['fwdbwd_frozen_ms'],
        r['fwdbwd_full_ms'], r['fwdbwd_full_written_ms'], a['fwdbwd_full_ms'] / r['fwdbwd_full_written_ms']))
PY
pack
el step; timeout 65 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"; step_line "$L/step.json"; pack
el step experts; timeout 75 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
el racecheck; timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2K128V128_T192_docs3_zeroState_noDhT_mixed' > "$L/racecheck.txt" 2>&1; echo "rc=$?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$L/racecheck.txt" | head -3; pack
left=$(( 540 - ($(date +%s) - t0) )); el "moe all (${left}s left)"
if [ "$left" -gt 70 ]; then
  timeout $(( left - 10 )) $D/bin/moetrain bench moe --gemm coop128x256c2x1,coop128x256c2x1:fuse --json "$L/moe_all.json" > "$L/moe_all.txt" 2>&1; echo "rc=$?"
  python3 -c "
import json
for r in json.load(open('$L/moe_all.json'))['runs']: print(r['case'], r['routing'], r.get('gemm','?'), 'fwd %.2f frozen %.2f written %.2f lora %.2f (+%.1f%%)'%(r['fwd_ms'],r['fwdbwd_frozen_ms'],r['fwdbwd_full_written_ms'],r['lora_fwdbwd_ms'],100*r['lora_overhead_fwdbwd']))" 2>&1 | tail -8; pack
fi
el done
