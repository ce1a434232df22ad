# moe15 (branch moe15, commit 62dd9f9 or later `git log moe15 -1`): issue 14's shape A full
# (dX + dW) path. New, all selectable: weight-gradient kernel :dw=coop128x256c2x1e16 (4 mainloop
# stages instead of 3), :down=<kernel> (the down projection's forward kernel), keep_h (bench field
# fwdbwd_full_written_keep_h_ms), SwiGLU forward two packs per thread (always on).
# Run from the repository root with the packed binaries in $D/bin, logs to $L/. About 90 s.
# 1. Correctness (~15 s).
timeout 40 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.HKeptFromForward:CudaGroupedFfn.WeightGradsWrittenUnderTheZeroHint:CudaGroupedFfn.SwigluExpertsWithLoraForwardBackward:CudaGroupedFfn.SwigluBackwardFormsHInTheSamePass:CudaGroupedFfn.Bf16Emulation*:CudaGroupedGemmConfig.EveryConfigurationEveryFormSkewedGroups:CudaGroupedGemmConfig.NamesRoundTrip*:CudaGroupedMatmul.*' > "$L/moe15_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|FAILED|Failure|seed=" "$L/moe15_suite.txt" | head -40
# 2. Sweep (~30 s): the default first and last (drift), e16 dW, the down projection on ping-pong
#    kernels, dX on ping-pong.
timeout 50 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --base-only --iters 10 --gemm coop128x256c2x1,coop128x256c2x1:dw=coop128x256c2x1e16,coop128x256c2x1:down=pingpong128x128c2x1,coop128x256c2x1:down=pingpong64x256c2x1,coop128x256c2x1:dx=pingpong128x128c2x1,coop128x256c2x1:dw=coop128x256c2x1e16:down=pingpong128x128c2x1,coop128x256c2x1 --json "$L/moe15_sweep.json" > "$L/moe15_sweep.txt" 2>&1; echo "sweep rc=$?"
python3 -c "
import json
for r in json.load(open('$L/moe15_sweep.json'))['runs']: print(r['case'], r['grouped_gemm'], 'fwd %.3f frozen %.3f full %.3f written %.3f keep_h %.3f' % (r['fwd_ms'], r['fwdbwd_frozen_ms'], r['fwdbwd_full_ms'], r['fwdbwd_full_written_ms'], r['fwdbwd_full_written_keep_h_ms']))" 2>&1 | tail -16
# 3. The default full bench (~15 s): LoRA, graphs, routing.
timeout 30 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --iters 5 --json "$L/moe15_bench.json" > "$L/moe15_bench.txt" 2>&1; echo "bench rc=$?"
# 4. Per-launch times (~35 s) of A uniform's base runs under e16 dW and a ping-pong down projection
#    (fwd, frozen, full, full written, full written with h kept, in launch order).
timeout 45 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --base-only --iters 1 --warmup 0 --gemm coop128x256c2x1:dw=coop128x256c2x1e16:down=pingpong128x128c2x1 > "$L/moe15_ncu.csv" 2> "$L/moe15_ncu.err"; echo "ncu rc=$?"
