#!/usr/bin/env bash
# Session 17, call 3 (issue 14): the steps at main f6caf45's binaries (the down projection's kernel
# by rows per expert: the step's MoE layers have 256 rows per expert, so the cooperative one now),
# the model and MoE device tests, memcheck over the grouped FFN, and Nsight Compute's full section
# set over the LoRA passes that read a [rows, 2048] operand (why out_grads moves 2.1 TB/s where
# dA_gu moves 3.3).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el steps; timeout 60 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"; step_line "$L/step.json"
timeout 60 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='*CudaModel*:*CudaMoe*:CudaGroupedFfn.*:CudaLoraGrouped.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected" "$L/suite.txt" | head -12; pack
el memcheck; timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*' > "$L/memcheck.txt" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$L/memcheck.txt" | head -3; pack
el ncu; timeout 90 ncu --set full --kernel-name regex:'out_grads_kernel|down_kernel|dw_kernel' --launch-skip 0 --launch-count 4 $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_full.txt" 2>&1; echo "ncu rc=$?"
grep -E "^  [a-z_]+kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Waves Per SM|Stall|L2 Hit|Mem Busy|Max Bandwidth|One or More Eligible|Issued Warp" "$L/ncu_full.txt" | head -80; pack
el done
