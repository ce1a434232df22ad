#!/usr/bin/env bash
# Session 10, call 4 (the last, trimmed to the device time left): the fused expert-LoRA SwiGLU
# backward, the packed dispatch kernels and kda10's gradient kernel on the GPU: their device
# tests, bench moe with torch._grouped_mm, bench kda, the expert-LoRA step, CudaDsaLong and the DSA
# step model at 8K.
set -u
cd "$(dirname "$0")/.."
. bench/calls/lib.sh
unpack
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaGrouped*:CudaLora*:CudaGraph*:CudaMoe*:*CudaKda*:CudaDsaLong*' > "$L/suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran" "$L/suite.txt" | head -20; pack
el moe; timeout 100 $D/bin/moetrain bench moe --cases A:uniform,B:uniform,B:skewed --iters 5 --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 40 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"; pack
el kda; timeout 40 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"; pack
el step; timeout 60 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "step rc=$?"; pack
el dsastep; timeout 60 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l-dsa.json --tokens 8192 --json "$L/step_dsa_8192.json" > "$L/step_dsa_8192.txt" 2>&1; echo "rc=$?"; pack
el done
