#!/usr/bin/env bash
# Session 21, call 3 (issue 14): the debug build of call 2 (branch debug21) with bit 16, the fused
# GEMMs' problem K rounded up to whole k-tiles (no out-of-bounds TMA box in the adapter's k-tile;
# the extra rows and columns it reads are not used by the kernel's final wgmma), ncu per fused
# kernel at B and A uniform: does the K + r GEMMs' cost over the frozen ones come from TMA's
# out-of-bounds fill?
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=300
for c in B A; do
  for d in 0 16 14 30; do
    l=$(left); [ "$l" -gt 30 ] || break
    el "ncu $c debug=$d"; MOETRAIN_DR_DEBUG=$d timeout 60 ncu --clock-control none --cache-control none --kernel-name-base demangled -k regex:LoraXa --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_${c}_$d.csv" 2> "$L/ncu_${c}_$d.err"; echo "ncu rc=$?"; tail -2 "$L/ncu_${c}_$d.err"; pack
  done
done
el done
