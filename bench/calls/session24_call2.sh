#!/usr/bin/env bash
# Session 24, call 2: the element-wise passes in 16-byte packs (ops/cuda/common.cuh,
# map_elements: SiLU, SwiGLU, sigmoid_gate, add_into, scale, sigmoid, the converting copy) and
# KDA's short conv with its SiLU in one op (CausalConvParams::silu), built without a device in
# session 24. The GPU suite in two parts (the whole suite outruns one 300 s budget), then the
# expert-LoRA step under the kernel tracer, this binary and main's (carried as
# .gpu/moetrain_main.xz), in one call. main's binary, here: `git worktree add /tmp/m 5d6552b`;
# in /tmp/m, `tools/fetch_cutlass.sh`, then `MOETRAIN_CMAKE_ARGS="-DMOETRAIN_CUDA=ON
# -DMOETRAIN_BENCH=OFF" tools/build.sh build-cuda --target moetrain_cli`; after `tools/gpu.sh
# pack`, `strip -o /tmp/mm /tmp/m/build-cuda/moetrain && xz -T2 -6 -c /tmp/mm >
# .gpu/moetrain_main.xz`.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
unpack_main
# Part 2 leaves out the interleaved tests: call 1 ran them alone (a trap there ends the process).
first='CudaElementwise.*:CudaActivation.*:CudaConv1d.*:CudaKda*:*CudaModel*:CudaGraph.*'
el "suite, part 1"; timeout 200 $D/bin/gpu_suite --gtest_filter="$first" > "$L/suite1.txt" 2>&1
echo "rc=$?"; grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|exception" "$L/suite1.txt" | head -12; pack
el "suite, part 2"; timeout 280 $D/bin/gpu_suite --gtest_filter="-$first:CudaGroupedFfn.Interleaved*" > "$L/suite2.txt" 2>&1
echo "rc=$?"; grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|exception" "$L/suite2.txt" | head -12; pack
traced_steps moetrain moetrain_main
el done
