#!/usr/bin/env bash
# Session 14, call 2 (mid-session): the helpers' first versions merged for measurement (branch
# mid14: kda14b's grads_v2_kernel, kda14c's products_v2, moe14's LoRA packing and dout blocks,
# dsa14's wgmma sparse MQA forward), each helper's request script (their tests, bench, ncu) with
# its logs in its own folder, then racecheck over the sanitizer-sized sparse MQA case.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
L0=$L
for n in kda14b kda14c moe14 dsa14; do
  el "$n"; L=$L0/$n; mkdir -p "$L"; D=$D L=$L bash "bench/calls/session14_req_$n.sh" 2>&1 | tail -40; L=$L0; pack
done
el mqarace; timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 $D/bin/gpu_suite --gtest_filter="CudaSparseMqa.SanitizerSized" > "$L/synccheck_mqa.txt" 2>&1; echo "rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/synccheck_mqa.txt" | head -3; pack
el done
