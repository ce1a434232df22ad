#!/usr/bin/env bash
# Session 18, call 5 (issue 14): where the fused xa gate/up GEMM's time goes (call 4: 1,726 us at A
# against 1,549 for the K + r GEMM it replaces, beside which the xa pass took 177). Two variants of
# main's binary, each with grouped_gemm_sm90_lora_xa.cu built with one macro of a throwaway patch
# of lora_xa_mainloop.cuh (not committed): MT_XA_NO_SIDE_MMA (no m64n16k16 wgmmas; the loads,
# the drain, the register-A wgmma and the xa store stay) and MT_XA_NO_SIDE_LOAD (no bulk copy of
# the A slices; the wgmmas read stale shared memory). Per kernel at the running clocks (ncu), shape
# A uniform, main's binary first. Timing only: the variants' results are wrong by design.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
for v in NO_SIDE_MMA NO_SIDE_LOAD; do xz -dc .gpu/moetrain_$v.xz > $D/bin/moetrain_$v && chmod +x $D/bin/moetrain_$v; done
for b in moetrain moetrain_NO_SIDE_MMA moetrain_NO_SIDE_LOAD; do
  el "ncu $b"; timeout 40 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/$b bench moe --cases A:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_$b.csv" 2> "$L/ncu_$b.err"; echo "ncu rc=$?"; pack
done
el done
