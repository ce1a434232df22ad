# kda16 final (branch kda16 at 09babcb, rebased on main efbea23). Since call 2: (a) the bf16 bound's
# emulation rounds the chunk states where the GPU stores them in bf16 (call 2's one failure: Chunked64_K128V64_
# strongDecay dg 0.00182 > 0.00153; the harness's bf16_emulation, see the report); (b) bwd_pre fused into the
# backward's prep by default: Delta (kda_fused_delta, call 2's fwdbwd_ms_fused_delta: B2 6.63) AND now its
# second job E = Aqk^T dO, F = Qh^T dO (kda_fused_pre, NEW, untested on a GPU): bwd_pre no longer launches.
# FALLBACK if anything *fused*/delta_only fails: src/ops/kda_prep_path.cpp `bool fused_pre = true;` -> false
# (call 2's validated form); if Delta itself fails: `bool fused_delta = true;` -> false.
# 1. Correctness (~60 s).
timeout 120 $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2*:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T250_docs2_h0_dhT_mild:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/*bwdPreDelta:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/*keepPrepared*:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K128V128_T300_docs1_h0_dhT_strong:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K64V64_T393_docs5_h0_dhT_mild:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K128V128_T192_docs3_zeroState_noDhT_mixed:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K64V128_T393_docs5_h0_dhT_mixed:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K128V128_T264_docs2_h0_dhT_moderate:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/*bwdPreDelta:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/*keepPrepared*:CudaKdaTcPrepared.*:CudaKdaPrepared.*:CudaKdaEval.*:CudaKdaEntry.*:Kda/CudaKda.ForwardBackward/*:CudaKdaFla.*:CudaModel.*' > "$L/kda16f_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|actual" "$L/kda16f_suite.txt" | head -40
# 2. (bench kda: run by session16_call4.sh before this.)
# 3. The overlapped forward at scale + the default backward (~32 s).
timeout 60 $D/bin/gpu_suite --gtest_filter='CudaKdaTcOverlap.*' > "$L/kda16f_overlap.txt" 2>&1; echo "overlap rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=" "$L/kda16f_overlap.txt" | head -10
# Optional (~200 s): the whole KDA suite, --gtest_filter='*Kda*'.
