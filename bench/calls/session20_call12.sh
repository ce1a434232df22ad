#!/usr/bin/env bash
# Session 20, call 12 (issue 14): ncu per kernel at A and B uniform with the down dX GEMM forming dr
# and dB (and dr=staged beside it), then the expert-LoRA step.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=330
for c in A B; do
  el "ncu $c"; timeout 70 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants dr=staged > "$L/ncu_$c.csv" 2> "$L/ncu_$c.err"; echo "ncu rc=$?"; pack
done
l=$(left); el "step (${l}s left)"
if [ "$l" -gt 60 ]; then
  timeout $(( l - 10 )) $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
fi
el done
