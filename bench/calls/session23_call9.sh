#!/usr/bin/env bash
# Session 23, call 9 (issue 14): main's binary (1c93a10's kernels; main's later commits changed
# tools and docs only) on all four `bench moe` cases, then torch._grouped_mm (bench/moe_torch.py) in
# the same call, for the session's closing figures.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
unpack_main
el "moe all"; timeout 90 $D/bin/moetrain_main bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/bench_moe.txt" 2>&1; echo "rc=$?"; pack
el torch; timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch; pack
el done
