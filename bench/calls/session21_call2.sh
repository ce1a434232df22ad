#!/usr/bin/env bash
# Session 21, call 2 (issue 14): a throwaway debug build (branch debug21, not merged) whose fused dX
# GEMMs skip parts of their work by MOETRAIN_DR_DEBUG bits (1: the dB atomics, 2: the dB wgmmas and
# atomics, 4: R's tile store and its barriers, 8: dr's side wgmmas), ncu per fused kernel at B and A
# uniform, to find where their time over the frozen GEMMs goes.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=400
for c in B A; do
  for d in 0 1 2 6 8 14; do
    l=$(left); [ "$l" -gt 30 ] || break
    el "ncu $c debug=$d"; MOETRAIN_DR_DEBUG=$d timeout 60 ncu --clock-control none --cache-control none --kernel-name-base demangled -k regex:LoraXa --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_${c}_$d.csv" 2> "$L/ncu_${c}_$d.err"; echo "ncu rc=$?"; pack
  done
done
el done
