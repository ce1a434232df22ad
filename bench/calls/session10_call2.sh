#!/usr/bin/env bash
# Session 10, call 2: the staged up products and saved h of expert LoRA, moe10a's routing and
# CUDA-graph timings: MoE/LoRA/graph device tests, ncu of bench moe A uniform, bench moe (4 cases)
# with torch._grouped_mm in the same call, the expert-LoRA step. Logs in one tarball.
set -u
cd "$(dirname "$0")/.."
. bench/calls/lib.sh
unpack
el test; timeout 150 $D/bin/gpu_suite --gtest_filter='CudaGrouped*:CudaLora*:CudaGraph*:CudaMoe*:CudaModel*:CudaRouter*' > "$L/suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran" "$L/suite.txt" | head -20; pack
el ncu moe; timeout 100 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 1 > "$L/ncu_moe.csv" 2> "$L/ncu_moe.log"; echo "rc=$?"; pack
el moe; timeout 150 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"; tail -3 "$L/moe.txt" | cut -c1-300
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"; pack
el step; timeout 80 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "step rc=$?"; tail -2 "$L/step_experts.txt"; pack
el done; ls -la "$OUT"
