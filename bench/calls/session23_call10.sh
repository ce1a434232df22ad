#!/usr/bin/env bash
# Session 23, call 10: the strided copy's 16-byte row path (ops/cuda/elementwise.cu, copy_rows16):
# the whole GPU suite (the copy runs under every op that joins or splits views), then the
# expert-LoRA step under the kernel tracer for this binary and main's (1c93a10, carried as
# .gpu/moetrain_main.xz).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
unpack_main
el suite; timeout 300 $D/bin/gpu_suite > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|exception" "$L/suite.txt" | head -12; pack
T=$PWD/.gpu/trace
for b in moetrain moetrain_main; do
  el "step $b"
  MT_KERNEL_TRACE=$L/step_$b.csv LD_PRELOAD=$T/libkernel_trace.so LD_LIBRARY_PATH=$T:$LD_LIBRARY_PATH \
    timeout 90 $D/bin/$b bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 \
    --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts --json "$L/step_$b.json" > "$L/step_$b.txt" 2>&1; echo "rc=$?"
  step_line "$L/step_$b.json"
  python3 "$T/summarize.py" "$L/step_$b.csv" --by-name 12 | head -14; pack
done
el done
