#!/usr/bin/env bash
# Session 15, call 1: what session 14's final call did not reach, plus the KDA,
# grouped-FFN and expert-LoRA device tests on the tree. The sparse MQA tests whole (the wgmma forward
# forms' tile edges, LargerSelection, the sanitizer-sized cases) before Wgmma2 becomes the DSA
# layer's default; bench dsa through Wgmma2 at 8K and 32K; racecheck over the wgmma and the joined
# MoE SwiGLU kernels; then fla's anchors with their autotuning kept across calls
# (next_fla_anchor.sh's sequence: pack with FLA_AUTOTUNE=<the last call's fla_autotune.tgz>).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el mqa; timeout 200 $D/bin/gpu_suite --gtest_filter='*CudaSparseMqa*' > "$L/suite_mqa.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|Failure|seed=" "$L/suite_mqa.txt" | head -20; pack
el kda_ffn; timeout 110 $D/bin/gpu_suite --gtest_filter='*Kda*:CudaGroupedFfn.*:CudaLoraGrouped.*' > "$L/suite_kda_ffn.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=|tests ran" "$L/suite_kda_ffn.txt" | head -20; pack
el race; timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa.SanitizerSizedWgmma:CudaLoraGrouped.FusedSwigluKernelsAgainstTheCpuComposites' > "$L/racecheck.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck.txt" | head -3; pack
el dsa; timeout 120 $D/bin/moetrain bench dsa --tokens 8192,32768 --iters 3 --mqa-kernels wgmma2 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa.json'))['runs']: print({k: (round(v,2) if isinstance(v,float) else v) for k,v in r.items() if 'ms' in k or k in ('T','mqa_kernels')})" 2>&1 | cut -c1-900; pack
el kda; timeout 60 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"; pack
python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
fla_cache_restore
left=$(( 560 - ($(date +%s) - t0) )); el "fla (${left}s left)"
timeout "$left" python3 bench/kda_fla.py --autotune-cache "$FLA_CACHE" \
  --cases packed16_T16384,B2_T8192,packed16_T16384_gate,B2_T8192_gate,B1_T65536 \
  > "$L/fla.jsonl" 2> "$L/fla.err"; echo "fla rc=$?"
cut -c1-300 "$L/fla.jsonl"; grep -E "autotuning" "$L/fla.err" | tail -12
fla_cache_save; pack
el done
