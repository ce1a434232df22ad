#!/usr/bin/env bash
# For session 16's first device call (written at the end of session 15, which had no device time
# left): what session 15's final call did not reach, and the checks its last commits need.
# - The whole KDA suite (the review pass after session 15's last call merged chunk_table_kernel's two
#   ranking loops, and moved the tests' switch guards onto ops::KdaSwitchScope), with the two cases
#   the final call's slot cut off (the waves overlap and the grid's document
#   order, bit for bit against prep-then-state), and the new 32-head one-document case whose
#   persistent prep runs two items a block, under racecheck (the prep and the state pass that
#   follows its flags; the stalled-flag trap is now timed by %globaltimer), and CudaKdaTcOverlap
#   with its new checks (the overlapped path taken; a CUDA graph of it replayed bit for bit).
# - CudaModel.* with Wgmma2 the DSA default (Bf16DsaKlInBackwardMatchesKlInForward: the KL target
#   of Split's backward against Wgmma2's forward lse), and LargerSelection on Wgmma3 before it can
#   become the default backward.
# - The step benchmark (issue 12's KDA share, issue 14's expert-LoRA step) on the merged kernels.
# fla needs no tuning now: tools/gpu.sh pack takes bench/fla_autotune_h200.tgz.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el kda; timeout 170 $D/bin/gpu_suite --gtest_filter='*Kda*' > "$L/suite_kda.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=" "$L/suite_kda.txt" | head -12; pack
for k in prep_tc fwd_state_v2; do
  timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=$k $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T300_docs1_h0_dhT_mild' > "$L/racecheck_$k.txt" 2>&1; echo "racecheck $k rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_$k.txt" | head -3
done; pack
el model; timeout 90 $D/bin/gpu_suite --gtest_filter='*CudaModel*' > "$L/suite_model.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=" "$L/suite_model.txt" | head -12; pack
el mqa; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa.LargerSelection' > "$L/suite_mqa.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=" "$L/suite_mqa.txt" | head -8; pack
el step; timeout 65 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"; step_line "$L/step.json"; pack
el step experts; timeout 75 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
el done
