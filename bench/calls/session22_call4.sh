#!/usr/bin/env bash
# Session 22, call 4 (issue 14): why the fused xa GEMM's mainloop runs ~10% more cycles than the
# stock one at shape B. ncu's warp-state section (raw stall metrics) and its per-SASS-instruction
# source counters (warp stall samples) over the first fused gate/up GEMM and the first stock one.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=300
for k in LoraXa TailTrimmed; do
  el "ncu stalls $k"
  timeout 80 ncu --section WarpStateStats --section SchedulerStats --page raw --csv --kernel-name-base demangled -k "regex:cutlass::device_kernel<.*$k" --launch-count 1 \
    $D/bin/moetrain bench moe --cases B:uniform --iters 1 --warmup 0 --lora-variants none > "$L/stall_$k.csv" 2> "$L/stall_$k.err"; echo "rc=$?"; pack
  el "ncu source $k"
  timeout 80 ncu --section SourceCounters --section WarpStateStats --page source --print-source sass --csv --kernel-name-base demangled -k "regex:cutlass::device_kernel<.*$k" --launch-count 1 \
    $D/bin/moetrain bench moe --cases B:uniform --iters 1 --warmup 0 --lora-variants none > "$L/sass_$k.csv" 2> "$L/sass_$k.err"; echo "rc=$?"; pack
done
ls -la $L
el done
