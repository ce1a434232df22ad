#!/usr/bin/env bash
# Session 19, call 5 (issue 14): out_grads_kernel's dB through float4 atomics (lanes trade a pair;
# call 4: float2 atomics held L2 at 90% with DRAM at 64%). The FFN / LoRA / MoE / model tests,
# ncu per kernel at A and B, bench moe (all four cases) with torch, the expert-LoRA step.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=560
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:*CudaModel*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|FAILED  \]|seed=" "$L/suite.txt" | head -12; pack
for c in A B; do
  el "ncu $c"; timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed --csv $D/bin/moetrain bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_$c.csv" 2> "$L/ncu_$c.err"; echo "ncu rc=$?"; pack
done
el moe; timeout 200 $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch; pack
l=$(left); el "step (${l}s left)"
if [ "$l" -gt 60 ]; then
  timeout $(( l - 10 )) $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
fi
el done
