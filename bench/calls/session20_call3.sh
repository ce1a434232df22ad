#!/usr/bin/env bash
# Session 20, call 3: call 2 found an illegal instruction in the bf16 pass of
# CudaGroupedFfn.KConcatLoraInTheBaseGemms (the down dX GEMM with dr and dB) while the direct test
# passed under memcheck. Each test alone, then memcheck and synccheck.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=400
F='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop'
K='CudaGroupedFfn.KConcatLoraInTheBaseGemms'
el direct; timeout 60 $D/bin/gpu_suite --gtest_filter=$F > "$L/direct.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|exception|bf16" "$L/direct.txt" | head -12; pack
el kconcat; timeout 60 $D/bin/gpu_suite --gtest_filter=$K > "$L/kconcat.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|exception" "$L/kconcat.txt" | head -6; grep -B3 exception "$L/kconcat.txt" | head -8; pack
el synccheck; timeout 100 compute-sanitizer --tool synccheck $D/bin/gpu_suite --gtest_filter=$F > "$L/synccheck.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)|Barrier|Invalid|at 0x|Divergent" "$L/synccheck.txt" | head -12; pack
el memcheck-kconcat; timeout 200 compute-sanitizer --tool memcheck $D/bin/gpu_suite --gtest_filter=$K > "$L/memcheck_k.txt" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)|Invalid|Illegal|at 0x|exception" "$L/memcheck_k.txt" | head -12; pack
el done
