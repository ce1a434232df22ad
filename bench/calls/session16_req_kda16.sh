# kda16 (branch kda16, rebased on main 6580b05, HEAD d4c53ba): what KDA keeps for backward, 1.50 -> 0.25 GiB at B2 T8192:
# (1) bf16 chunk states where the bf16 tensor-core path runs (forward state pass rounds, bwd_pre and the
# products widen; products v2 stages them through registers); (2) the layer keeps no prepared blocks by
# default (kda_keep_prepared off): the training forward runs the eval prep (no T/KK/Kb), backward preps again.
# bench kda times the old form in the same run: fwdbwd_ms_keep_prepared (kept prepared + fp32 states) and
# fwdbwd_ms_f32_states (default without bf16 states). (3) OFF by default, to decide from this call: backward's
# Delta = U - W S0 formed at the end of its prep (kda_set_fused_delta) instead of by bwd_pre's job 0: bench
# fwdbwd_ms_fused_delta vs fwdbwd_ms_unfused_delta; tests *fusedDelta* and every TensorCorePrepAgrees case's
# "fused vs bwd_pre Delta" gap. About 95 s of device time.
# 1. Correctness (~30 s): the CudaKdaTc cases on the default (H2 all, one H32), the pinned old form
#    (*keepPreparedF32States), the two-form comparison (TensorCorePrepAgrees...), prepared/eval/entry, layer+planner.
timeout 60 $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H2*:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/*keepPrepared*:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/*fusedDelta*:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/*fusedDelta*:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T250_docs2_h0_dhT_mild:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K128V128_T300_docs1_h0_dhT_strong:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K64V64_T393_docs5_h0_dhT_mild:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K128V128_T192_docs3_zeroState_noDhT_mixed:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K128V64_T393_docs5_h0_dhT_strong:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/*keepPrepared*:CudaKdaTcPrepared.*:CudaKdaPrepared.*:CudaKdaEval.*:CudaKdaEntry.*:Kda/CudaKda.ForwardBackward/Chunked*:CudaKdaFla.*:CudaModel.*' > "$L/kda16_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|FAILED|Failure|seed=|Expected|Which is|actual" "$L/kda16_suite.txt" | head -40
grep -E "dq |dk |dg |saved" "$L/kda16_suite.txt" | grep -E "bf16|other form" | head -30
# 2. Timing (~35 s): fwdbwd_ms (new default) vs fwdbwd_ms_keep_prepared (old form, same run) vs fla
#    (B2 10.184, B1 43.00, packed 10.449 ms); saved_for_backward_gib (fla 0.375 at B2).
timeout 60 $D/bin/moetrain bench kda --iters 5 --warmup 1 --json "$L/kda16_bench_kda.json" > "$L/kda16_kda.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
for r in json.load(open('$L/kda16_bench_kda.json'))['runs']: print(r['case'], {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k.startswith(('fwd', 'saved', 'keeps', 'launches'))})" 2>&1 | tail -4
# 3. The overlapped forward at scale with the default form (~31 s; last, so that it cannot starve the above).
timeout 40 $D/bin/gpu_suite --gtest_filter='CudaKdaTcOverlap.*' > "$L/kda16_overlap.txt" 2>&1; echo "overlap rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=" "$L/kda16_overlap.txt" | head -10
