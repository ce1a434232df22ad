#!/usr/bin/env bash
# GPU work in stages. The device machine lacks our Debian libraries, so the CUDA build happens here
# and travels with its shared libraries:
#   tools/gpu.sh pack              (here)   build -DMOETRAIN_CUDA=ON into build-cuda, copy the GPU
#                                           binaries and the libraries they need into .gpu/
#                                           (WHEELS=dir: fla's wheels too; FLA_AUTOTUNE=file: the
#                                           fla autotuning results a call sent back; by default
#                                           bench/fla_autotune_h200.tgz, session 15's)
#   tools/gpu.sh test [sanitize]   (device) run the CUDA tests from .gpu/ (and compute-sanitizer
#                                           memcheck + racecheck over them); JSON + logs to $OUT
#   tools/gpu.sh bench             (device) `moetrain bench step` on the Kimi-Linear-width 8-layer
#                                           model (bench/models/kimi-linear-8l.json); TOKENS=8192
#   tools/gpu.sh anchors           (device) ../shared/bench/hf_lora_step.py (transformers + PEFT +
#                                           fla), from the copy and the wheels that pack put in .gpu/
#   tools/gpu.sh kernels           (device) ncu times of the first LAUNCHES (12) launches of the
#                                           kernels matching KERNELS (our attention and KDA kernels)
#                                           in one bench step; a table and $OUT/kernels.json
#   tools/gpu.sh trace [options]   (device) every kernel of a two-step bench (warm-up and the
#                                           profiled step included), timed back to back by
#                                           tools/kernel_trace (CUPTI; the image has no Nsight
#                                           Systems), summed by name: $OUT/trace_kernels.json and
#                                           a table
# The device call: run(command="tools/gpu.sh test sanitize", carry=[".gpu"]); stages chain:
# "tools/gpu.sh test && tools/gpu.sh bench && tools/gpu.sh anchors". The last lines printed are a
# short table; $OUT/gpu_summary.json, bench_step.json and hf_lora_step.json hold the same in JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
shift || true

# The packed binaries into $1 (Python's lzma where the image lacks xz).
unpack_to() {
  tar -C "$1" -xJf .gpu/pack.tar.xz 2>/dev/null ||
    python3 -c "import tarfile, sys; tarfile.open('.gpu/pack.tar.xz').extractall(sys.argv[1])" "$1"
}

pack() {
  MOETRAIN_CMAKE_ARGS="-DMOETRAIN_WERROR=ON -DMOETRAIN_CUDA=ON ${MOETRAIN_CMAKE_ARGS:-}" \
    tools/build.sh build-cuda --target moetrain_cli gpu_suite test_golden
  rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
  cp build-cuda/moetrain build-cuda/tests/gpu_suite build-cuda/tests/test_golden .gpu/bin/
  # Every library the binaries load except the C runtime, the CUDA driver/toolkit and NCCL (218 MB:
  # over the carry limit), which the device image has in versions the binaries accept (2.28).
  for b in .gpu/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas[^/]*|libnccl|libnvidia[^/]*|libstdc\+\+|libgcc_s|libz|libudev)\.so' |
    while read -r lib; do cp -L "$lib" .gpu/lib/; done
  strip --strip-debug .gpu/bin/* 2>/dev/null || true
  # The device call carries at most 64 MiB with the repository: travel compressed, with xz (the
  # three static binaries' CUDA fatbins halve against gzip's: 26 MB where gzip left 55).
  tar -C .gpu -cf - bin lib | xz -T2 -6 > .gpu.txz && rm -rf .gpu && mkdir .gpu &&
    mv .gpu.txz .gpu/pack.tar.xz
  # The anchor script and fla's wheels (the device has no package registry). WHEELS: a folder
  # holding flash-linear-attention and fla-core 0.6.0 (pip download --no-deps ...).
  if [ -f ../shared/bench/hf_lora_step.py ]; then cp ../shared/bench/hf_lora_step.py .gpu/; fi
  if [ -d "${WHEELS:-}" ]; then mkdir -p .gpu/wheels && cp "$WHEELS"/*.whl .gpu/wheels/; fi
  # fla's autotuning results from an earlier call (bench/calls/lib.sh, fla_cache_save).
  local tuned=${FLA_AUTOTUNE:-bench/fla_autotune_h200.tgz}
  if [ -f "$tuned" ]; then cp "$tuned" .gpu/fla_autotune.tgz; fi
  # Prepared datasets a device run trains on (the GPU-vs-CPU loss curves): GPU_DATA=dir.
  if [ -d "${GPU_DATA:-}" ]; then mkdir -p .gpu/data && cp -r "$GPU_DATA" .gpu/data/; fi
  # The kernel tracer (tools/gpu.sh trace, bench/calls): CUPTI from this machine's toolkit.
  tools/kernel_trace/build.sh .gpu/trace || echo "pack: the kernel tracer was not built"
  du -sh .gpu
}

test_stage() {
  local out=${OUT:-/tmp/gpu_out} dir=/tmp/moetrain-gpu
  mkdir -p "$out" "$dir"
  unpack_to "$dir"
  export LD_LIBRARY_PATH="$dir/lib:${LD_LIBRARY_PATH:-}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
  local rc=0
  "$dir/bin/gpu_suite" --gtest_output=json:"$out/gpu_suite.json" 2>&1 | tee "$out/gpu_suite.log" || rc=$?
  # The HF goldens through the GPU (moetrain forward --device cuda's path), from the repo root.
  "$dir/bin/test_golden" --gtest_filter='GoldenCuda.*' 2>&1 | tee "$out/golden_cuda.log" | tail -3 || rc=$?
  local san="not run"
  if [ "${1:-}" = sanitize ]; then
    san=""
    for tool in memcheck racecheck; do
      if compute-sanitizer --tool "$tool" --error-exitcode 9 "$dir/bin/gpu_suite" --gtest_filter="${SANITIZE_FILTER:-*Cuda*}" \
          --gtest_brief=1 >"$out/sanitize_$tool.log" 2>&1; then
        san="$san $tool:clean"
      else
        san="$san $tool:FAILED($?)"
      fi
    done
  fi
  python3 - "$out" "$rc" "$san" <<'PY'
import json, sys
out, rc, san = sys.argv[1], int(sys.argv[2]), sys.argv[3].strip()
r = json.load(open(f"{out}/gpu_suite.json"))
rows, why = [], {}
for suite in r["testsuites"]:
    for t in suite["testsuite"]:
        status = "FAIL" if t.get("failures") else ("SKIP" if t.get("result") == "SKIPPED" else "ok")
        name = f'{suite["name"]}.{t["name"]}'
        rows.append((name, status))
        if status == "FAIL":
            msgs = [f["failure"] for f in t["failures"]]
            why[name] = " | ".join(m.replace("\n", " ")[:160] for m in msgs[:2])
json.dump({"tests": rows, "failures": why, "exit": rc, "sanitizer": san},
          open(f"{out}/gpu_summary.json", "w"), indent=1)
for name, status in rows:
    if status != "ok":
        print(f"{status:5} {name}: {why.get(name, '')[:300]}")
print(f"tests: {sum(s == 'ok' for _, s in rows)} ok, {sum(s == 'FAIL' for _, s in rows)} failed, "
      f"{sum(s == 'SKIP' for _, s in rows)} skipped; sanitizer: {san}")
PY
  return $rc
}

unpack() {
  local dir=/tmp/moetrain-gpu
  if [ ! -x "$dir/bin/moetrain" ]; then mkdir -p "$dir" && unpack_to "$dir"; fi
  export LD_LIBRARY_PATH="$dir/lib:${LD_LIBRARY_PATH:-}"
  MOETRAIN_BIN="$dir/bin/moetrain"
}

bench_stage() {
  local out=${OUT:-/tmp/gpu_out}
  mkdir -p "$out"
  unpack
  "$MOETRAIN_BIN" bench step --model bench/models/kimi-linear-8l.json --tokens "${TOKENS:-8192}" \
    --steps "${STEPS:-5}" --json "$out/bench_step_${TOKENS:-8192}.json" "$@" 2>&1 | tee -a "$out/bench_step.log"
}

anchors_stage() {
  local out=${OUT:-/tmp/gpu_out}
  mkdir -p "$out"
  if ! python3 -c "import fla" 2>/dev/null; then
    python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl >"$out/pip.log" 2>&1 || tail -5 "$out/pip.log"
  fi
  OUT="$out" python3 .gpu/hf_lora_step.py "${@:-grouped}" 2>&1 | tee -a "$out/hf_lora_step.log"
}

kernels_stage() {
  local out=${OUT:-/tmp/gpu_out}
  mkdir -p "$out"
  unpack
  ncu --kernel-name "regex:${KERNELS:-flash_|state_kernel|products_kernel|grads_kernel|prep_kernel}" \
    --launch-count "${LAUNCHES:-12}" --metrics gpu__time_duration.sum --csv \
    "$MOETRAIN_BIN" bench step --model bench/models/kimi-linear-8l.json --tokens "${TOKENS:-8192}" \
    --steps 1 >"$out/kernels.csv" 2>"$out/kernels.log" || { tail -5 "$out/kernels.log"; return 1; }
  python3 - "$out" <<'PY'
import csv, json, sys
out = sys.argv[1]
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3, "ns": 1e-6, "us": 1e-3,
         "ms": 1.0, "s": 1e3}
rows = []
lines = [l for l in open(f"{out}/kernels.csv") if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("skinny::", "")
    name = name.split("(")[0]
    name = name.replace("void ", "")
    ms = float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1.0)
    rows.append({"kernel": name, "grid": r.get("Grid Size", ""), "ms": ms})
json.dump(rows, open(f"{out}/kernels.json", "w"), indent=1)
for r in sorted(rows, key=lambda r: -r["ms"]):
    print(f'{r["ms"]:9.3f} ms  {r["kernel"]}  {r["grid"]}')
PY
}

# Where a whole step's GPU time goes: every kernel of a two-step bench (its warm-up and profiled
# steps too) as the run goes, back to back (tools/kernel_trace, which pack built into .gpu/trace;
# ncu times kernels one at a time, after pauses, at clocks the run under the power cap does not
# keep), summed by name: the top TOP (40) as a table, $OUT/trace_kernels.json, and the timeline as
# $OUT/kernels.csv.
# Options go to `bench step` (--lora-targets ...).
trace_stage() {
  local out=${OUT:-/tmp/gpu_out} t=$PWD/.gpu/trace
  mkdir -p "$out"
  [ -f "$t/libkernel_trace.so" ] ||
    { echo "trace: no .gpu/trace (tools/gpu.sh pack builds it)"; return 1; }
  unpack
  MT_KERNEL_TRACE="$out/kernels.csv" LD_PRELOAD="$t/libkernel_trace.so" \
    LD_LIBRARY_PATH="$t:${LD_LIBRARY_PATH:-}" "$MOETRAIN_BIN" bench step \
    --model bench/models/kimi-linear-8l.json --tokens "${TOKENS:-8192}" --steps 2 "$@" \
    >"$out/trace.log" 2>&1 || { tail -5 "$out/trace.log"; return 1; }
  python3 "$t/summarize.py" "$out/kernels.csv" --by-name "${TOP:-40}" --json "$out/trace_kernels.json"
}

# Any moetrain command with the packed binary: tools/gpu.sh cli train --job ...
cli_stage() {
  unpack
  "$MOETRAIN_BIN" "$@"
}

case "$stage" in
  pack) pack ;;
  test) test_stage "$@" ;;
  bench) bench_stage "$@" ;;
  anchors) anchors_stage "$@" ;;
  kernels) kernels_stage ;;
  trace) trace_stage "$@" ;;
  cli) cli_stage "$@" ;;
  *) echo "usage: tools/gpu.sh pack | test [sanitize] | bench [options] | anchors [variant ...] | kernels | trace | cli ARGS" >&2; exit 2 ;;
esac
