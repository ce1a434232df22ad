#!/usr/bin/env bash
# Session 20, call 14 (issue 14): the fused dr path only where it pays (sm90_lora_dr_pays: B's
# gate/up dX keeps the out_grads pass). The FFN / LoRA / model tests, then bench moe on all four
# cases against torch.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=300
el test; timeout 100 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaModel*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
l=$(left); el "moe (${l}s left)"
timeout $(( l - 50 )) $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 45 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch; pack
el done
