# swiglu16 (branch swiglu16, commit a79a486 or later `git log swiglu16 -1`): SwiGLU in the grouped GEMMs' epilogues, opt-in by
# the GEMM configuration part ":swiglu" (both), ":swiglu=fwd" or ":swiglu=bwd" (default unchanged).
# Forward: gate half = plain GEMM (n = F), up half = GEMM whose epilogue reads g (C, TMA) and writes u
# (D) and h (direct 4-byte stores). Backward: the down dX GEMM's epilogue turns dh into dgate_up
# (g as C; u by direct loads, L2-prefetched by the producer warp; du, h by direct stores).
# ~80 s of device time. Run from the repository root, binaries in $D/bin, logs to $L/.
# 1. Correctness (~20 s): the fused paths against the bf16 emulation (skewed, one-row/empty experts,
#    partial tiles, frozen / trained / keep_h) and the config names.
timeout 60 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.FusedSwiglu*:CudaGroupedFfn.SwigluInTheGemmEpilogues:CudaGroupedGemmConfig.NamesRoundTrip*' > "$L/swiglu16_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|FAILED|Failure|seed|worst|rel err" "$L/swiglu16_suite.txt" | head -40
# 2. Timing (~50 s): base runs, old path against each fused side and both (cooperative fused kernels),
#    then the ping-pong fused kernels (forward: gate half on ping-pong too; backward: dgate_up's dX too).
timeout 100 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --base-only --iters 5 --gemm coop128x256c2x1,coop128x256c2x1:swiglu=fwd,coop128x256c2x1:swiglu=bwd,coop128x256c2x1:swiglu,pingpong128x128c2x1:swiglu=fwd,coop128x256c2x1:dx=pingpong128x128c2x1:swiglu=bwd --json "$L/swiglu16_moe.json" > "$L/swiglu16_moe.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
d = json.load(open('$L/swiglu16_moe.json'))
for r in (d['runs'] if isinstance(d, dict) else d): print(r['case'], r['grouped_gemm'], {k: round(v, 3) for k, v in r.items() if k.endswith('_ms')})" 2>&1 | tail -14
