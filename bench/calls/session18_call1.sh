#!/usr/bin/env bash
# Session 18, call 1 (issue 14): the forward forms' tail-trimmed mainloop (the K + r GEMMs' last k-tile
# stops at K: ops/cuda/cutlass/tail_trimmed_mainloop.cuh). Device tests of the grouped GEMMs, FFN,
# LoRA, MoE and model (session 17's later commits ran on the CPU only), the racecheck rerun over
# out_grads_kernel, bench moe with torch._grouped_mm in the next command, the LoRA kernels at the
# running clocks (ncu), the expert-LoRA step if time is left.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=420
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul*:CudaGroupedGemmConfig*:*CudaModel*:CudaGraph*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
el moe; timeout 90 $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch
pack
el ncu; timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_A.csv" 2> "$L/ncu_A.err"; echo "ncu rc=$?"; pack
el racecheck; for opt in "" "--racecheck-memcpy-async no"; do
  timeout 40 compute-sanitizer --tool racecheck $opt --error-exitcode 9 --kernel-name kns=out_grads_kernel $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.KConcatLoraInTheBaseGemms' > "$L/racecheck${opt:+_nomemcpy}.txt" 2>&1; echo "racecheck [$opt] rc=$?"
  grep -E "RACECHECK SUMMARY|Internal Sanitizer|PASSED|FAILED" "$L/racecheck${opt:+_nomemcpy}.txt" | head -3; pack
done
l=$(left); el "step (${l}s left)"
if [ "$l" -gt 70 ]; then
  timeout 50 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
fi
el done
