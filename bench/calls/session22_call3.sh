#!/usr/bin/env bash
# Session 22, call 3 (issue 14): where the fused xa GEMM's extra time goes at shape B. ncu's full
# section set over the first fused gate/up GEMM (LoraXa) and the first stock gate/up GEMM
# (TailTrimmed, the frozen forward) of one `bench moe --cases B:uniform` run; the fused down dX
# too. Then the adapter pack's jobs with row-wide writes (.gpu/packbench, scratch code).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=300
if [ -x .gpu/packbench ]; then el packbench; timeout 30 .gpu/packbench | tee "$L/packbench.txt"; pack; fi
for k in LoraXa TailTrimmed; do
  el "ncu full $k"
  timeout 100 ncu --set full --import-source no --kernel-name-base demangled -k regex:$k --launch-count 3 --csv --page details \
    $D/bin/moetrain bench moe --cases B:uniform --iters 1 --warmup 0 --lora-variants none > "$L/full_$k.csv" 2> "$L/full_$k.err"; echo "rc=$?"; pack
done
el done
