#!/usr/bin/env bash
# Session 10, call 5: the review commit's SwiGLU adapter kernels (shared helpers) on the GPU: the
# expert-FFN, LoRA, graph and MoE device tests, then compute-sanitizer memcheck over the expert
# FFN and LoRA tests (this session's new kernels: up_kernel, up_swiglu_kernel,
# up_swiglu_bwd_kernel, the packed dispatch kernels).
set -u
cd "$(dirname "$0")/.."
. bench/calls/lib.sh
unpack
el test; timeout 90 $D/bin/gpu_suite --gtest_filter='CudaGrouped*:CudaLora*:CudaGraph*:CudaMoe*' > "$L/suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran" "$L/suite.txt" | head; pack
el memcheck; timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn*:CudaLora*:CudaMoe*' > "$L/memcheck.txt" 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/memcheck.txt" | head; pack
el done
