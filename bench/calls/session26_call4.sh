#!/usr/bin/env bash
# Session 26, call 4: call 2 (session26_call2.sh) ended with the machine no longer answering and
# nothing returned, so this one is short, every stage under a hard kill and its logs packed as it
# ends. The expert-LoRA step under the kernel tracer (this binary: the element-wise passes in
# 16-byte packs, KDA's conv with its SiLU, the KDA kernel choices in the op params), then the
# device tests of what this session changed (the KDA families, whose kernel choices moved from
# process-wide switches into KdaParams; sparse MQA's generations; decoding's up-front check) and
# session 24's element-wise and conv tests.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
budget=240
unpack
T=$PWD/.gpu/trace
el "step"
MT_KERNEL_TRACE=$L/step.csv LD_PRELOAD=$T/libkernel_trace.so LD_LIBRARY_PATH=$T:$LD_LIBRARY_PATH \
  timeout -s KILL 70 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 \
  --steps 3 --warmup 1 --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts \
  --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"
step_line "$L/step.json"; python3 "$T/summarize.py" "$L/step.csv" --by-name 12 2>&1 | head -14; pack
el "tests"
timeout -s KILL $(( $(left) - 15 )) $D/bin/gpu_suite \
  --gtest_filter='CudaKda*:CudaSparseMqa.Heads16_32_64:CudaSparseMqa.SanitizerSized*:CudaDecode.*:CudaElementwise.*:CudaConv1d.*' \
  > "$L/tests.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|exception" "$L/tests.txt" | head -12
echo "ok: $(grep -c '^\[       OK' "$L/tests.txt")  failed: $(grep -c '^\[  FAILED  \] [A-Z]' "$L/tests.txt")"
tail -2 "$L/tests.txt"; pack
el done
