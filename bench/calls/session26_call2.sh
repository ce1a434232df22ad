#!/usr/bin/env bash
# Session 26, call 2 (after session24_call1.sh): session 24's call 2 reordered so that the A/B comes
# first. The expert-LoRA step under the kernel tracer, this binary (the element-wise passes in
# 16-byte packs, KDA's short conv with its SiLU, the kernel choices in the op params) and main's
# 5d6552b (session 23's measured state, carried as .gpu/moetrain_main.xz, built as
# session24_call2.sh's header says), then the GPU suite in two parts in the time left (part 1:
# the families this binary's changes touch; part 2 leaves out the interleaved tests, which call 1
# runs alone).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
budget=590
unpack
unpack_main
traced_steps moetrain moetrain_main
first='CudaElementwise.*:CudaActivation.*:CudaConv1d.*:CudaKda*:*CudaModel*:CudaGraph.*:CudaSparseMqa.*'
el "suite, part 1"; timeout $(( $(left) * 45 / 100 )) $D/bin/gpu_suite --gtest_filter="$first" > "$L/suite1.txt" 2>&1
echo "rc=$?"; grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|exception" "$L/suite1.txt" | head -12; pack
el "suite, part 2"; timeout $(( $(left) - 10 )) $D/bin/gpu_suite --gtest_filter="-$first:CudaGroupedFfn.Interleaved*" > "$L/suite2.txt" 2>&1
echo "rc=$?"; grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|exception" "$L/suite2.txt" | head -12
grep -c "^\[       OK" "$L/suite2.txt"; pack
el done
