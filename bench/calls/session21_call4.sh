#!/usr/bin/env bash
# Session 21, call 4 (issue 14): the debug build of call 3 with bit 32, the fused GEMMs' problem K
# cut by r (the padded operands at their pitches, the frozen GEMM's 36 k-tiles at B's down dX; the
# results are wrong): is the K + r GEMMs' cost over the frozen ones the extra k-tile or the pitches?
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=200
for c in B A; do
  for d in 14 46 0 32; do
    l=$(left); [ "$l" -gt 30 ] || break
    el "ncu $c debug=$d"; MOETRAIN_DR_DEBUG=$d timeout 60 ncu --clock-control none --cache-control none --kernel-name-base demangled -k regex:LoraXa --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_${c}_$d.csv" 2> "$L/ncu_${c}_$d.err"; echo "ncu rc=$?"; pack
  done
done
el done
