#!/usr/bin/env bash
# Session 24, call 1 (issue 14): the interleaved gate/up layout (GroupedFfnParams::
# interleaved_gate_up: SwiGLU in the gate/up GEMM's epilogue, grouped_gemm_sm90_swiglu.cu's
# UpInterleaved; with an adapter, the fused xa GEMM's XaIlGemm), built without a device in session
# 24. Its tests and the grouped families first (with memcheck over the new epilogues), then `bench
# moe --lora-variants none` on all four cases (each interleaved run in alternating rounds with the
# default layout's, LoRA's too) and torch._grouped_mm in the same call.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el "interleaved tests"
# Alone first: the interleaved epilogue __trap()s where CUTLASS's fragment layout is not the one it
# was written for, which ends the process (and would end every test and bench round after it).
timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.Interleaved*' > "$L/interleaved.txt" 2>&1
irc=$?; echo "rc=$irc"; grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|exception|trap|error" "$L/interleaved.txt" | head -8
inter_flag=""; [ $irc -ne 0 ] && inter_flag="--no-interleaved" && echo "interleaved failed: bench moe without it"
pack
el tests
timeout 240 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaElementwise.*:CudaGroupedMatmul*:CudaLoraGrouped.*:CudaModel.Bf16Vision*:-CudaGroupedFfn.Interleaved*' \
  > "$L/tests.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|exception" "$L/tests.txt" | head -12; pack
if [ $irc -eq 0 ]; then
  el memcheck
  timeout 120 compute-sanitizer --tool memcheck $D/bin/gpu_suite \
    --gtest_filter='CudaGroupedFfn.Interleaved*' > "$L/memcheck.txt" 2>&1
  echo "rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$L/memcheck.txt" | head -4; pack
fi
el "moe"
timeout 150 $D/bin/moetrain bench moe --iters 10 --lora-variants none $inter_flag --json "$L/bench_moe.json" \
  > "$L/bench_moe.txt" 2>&1; echo "rc=$?"; pack
el torch; timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"
echo "torch rc=$?"
python3 - "$L" <<'PY' 2>&1 | tail -16
import json, sys
L = sys.argv[1]
t = {(x['case'], x['routing']): x for x in map(json.loads, [l for l in open(L + '/moe_torch.jsonl') if l.startswith('{')])}
for r in json.load(open(L + '/bench_moe.json'))['runs']:
    a = t.get((r['case'], r['routing']), {})
    q = lambda k, ak: '%.3f (%.2fx)' % (r[k], a.get(ak, float('nan')) / r[k]) if k in r else '-'
    print(r['case'], r['routing'], 'fwd', q('fwd_ms', 'fwd_ms'), 'interleaved', q('fwd_interleaved_ms', 'fwd_ms'),
          'x%.3f' % r.get('fwd_interleaved_vs_default_median', float('nan')))
    print('   frozen', q('fwdbwd_frozen_ms', 'fwdbwd_frozen_ms'), 'interleaved', q('fwdbwd_frozen_interleaved_ms', 'fwdbwd_frozen_ms'),
          'x%.3f' % r.get('fwdbwd_frozen_interleaved_vs_default_median', float('nan')),
          '| full keep_h', q('fwdbwd_full_written_keep_h_ms', 'fwdbwd_full_ms'), 'interleaved',
          q('fwdbwd_full_written_keep_h_interleaved_ms', 'fwdbwd_full_ms'),
          'x%.3f' % r.get('fwdbwd_full_written_keep_h_interleaved_vs_default_median', float('nan')))
    print('   lora overhead, median of rounds: default %+.1f%%, interleaved %+.1f%%; interleaved LoRA x%.3f of default' % (
          100 * r.get('lora_overhead_fwdbwd_median', float('nan')),
          100 * r.get('lora_overhead_fwdbwd_interleaved_median', float('nan')),
          r.get('lora_fwdbwd_interleaved_vs_default_median', float('nan'))))
PY
pack
el done
