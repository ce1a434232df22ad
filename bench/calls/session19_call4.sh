#!/usr/bin/env bash
# Session 19, call 4 (issue 14): Nsight Compute's sections for the skinny LoRA passes that stream
# a [rows, d] operand at 2.5-3.5 TB/s (out_grads over dY and dgate_up, dA over h and X, the pack)
# at A and B, to see what holds them below HBM's speed.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
for c in A B; do
  el "ncu $c"
  timeout 120 ncu --clock-control none --kernel-name regex:"out_grads|dw_kernel|lora_pack" --launch-count 5 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_$c.txt" 2> "$L/ncu_$c.err"; echo "ncu rc=$?"; pack
done
el done
