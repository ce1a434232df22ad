#!/usr/bin/env bash
# Session 21, call 5 (issue 14): the debug build of call 4 with the K + r GEMM's work alone (bits 2,
# 4, 8 and 32: 36 k-tiles) at unpadded pitches (64: A's row pitch = K, 128: W's = its width; the
# rows read are not the right ones and the results are wrong): is the rest of the fused GEMMs' cost
# over the frozen ones the padded pitches?
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=240
for c in B A; do
  for d in 46 110 174 238; do
    l=$(left); [ "$l" -gt 30 ] || break
    el "ncu $c debug=$d"; MOETRAIN_DR_DEBUG=$d timeout 60 ncu --clock-control none --cache-control none --kernel-name-base demangled -k regex:device_kernel --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_${c}_$d.csv" 2> "$L/ncu_${c}_$d.err"; echo "ncu rc=$?"; pack
  done
done
el done
