#!/usr/bin/env bash
# Session 23, call 3 (issue 14): branch split23, the forward's fused xa GEMM in split mode (every
# n-block of a row block forms xa over its share of X's k-tiles in a side pass, f32 partials by
# atomics, the last warp rounds and stores), against main's binary (1c93a10, carried as
# .gpu/moetrain_main.xz) in one call: tests, memcheck and synccheck over the fused GEMM cases, then
# `bench moe` at B and A uniform for both binaries under the kernel tracer (per-kernel times in the
# back-to-back run, tools/kernel_trace).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
unpack_main
budget=420
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:CudaGraph.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception|Which is|differ" "$L/suite.txt" | head -16; pack
f='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop'
for tool in memcheck synccheck; do
  el $tool; timeout 60 compute-sanitizer --tool $tool $D/bin/gpu_suite --gtest_filter="$f" > "$L/$tool.txt" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/$tool.txt" | head -3; pack
done
T=$PWD/.gpu/trace
for c in B A; do
  for b in moetrain moetrain_main; do
    el "trace $c $b"
    MT_KERNEL_TRACE=$L/trace_${c}_$b.csv LD_PRELOAD=$T/libkernel_trace.so LD_LIBRARY_PATH=$T:$LD_LIBRARY_PATH \
      timeout 60 $D/bin/$b bench moe --cases $c:uniform --iters 10 --lora-variants none --json "$L/moe_${c}_$b.json" > "$L/moe_${c}_$b.txt" 2>&1; echo "rc=$?"
    python3 "$T/summarize.py" "$L/trace_${c}_$b.csv" --detail > "$L/sum_${c}_$b.txt" 2>&1; pack
  done
done
python3 - "$L" <<'PY'
import json, sys
L = sys.argv[1]
for c in 'BA':
    for b in ('moetrain', 'moetrain_main'):
        try:
            r = json.load(open(f'{L}/moe_{c}_{b}.json'))['runs'][0]
        except Exception as e:
            print(c, b, e); continue
        print(c, b, 'fwd', round(r['fwd_ms'], 3), 'frozen', round(r['fwdbwd_frozen_ms'], 3), 'lora fwd', round(r['lora_fwd_ms'], 3), 'lora', round(r['lora_fwdbwd_ms'], 3), 'median', round(100 * r['lora_overhead_fwdbwd_median'], 1),
              'rounds', [round(v, 2) for v in r['fwdbwd_frozen_rounds_ms']], [round(v, 2) for v in r['lora_fwdbwd_rounds_ms']])
PY
pack
el done
