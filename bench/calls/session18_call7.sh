#!/usr/bin/env bash
# Session 18, call 7 (issue 14): call 6 found NaN in the fused xa GEMM's gate_up at in = 256: the
# empty second tile of a group's last cluster counted its xa in the next group's first row tile,
# whose other n-blocks then read xa before it was stored. Fixed (group_row_tiles); the two tests.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el new; timeout 50 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms' > "$L/new.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|Failure|seed=|Expected|xa in the (GEMM|mainloop).*bf16" "$L/new.txt" | head -30; pack
el done
