# kda15 (branch kda15, commit a29e047 or later `git log kda15 -1`): (1) the overlapped forward where the
# 32-column state blocks fit one wave (B1 T65536: 128 blocks): a persistent prep (one block per SM + spares)
# flags each (chunk, head) and the state pass, its programmatic dependent launch, runs beside it on the flags
# (kda_forward_overlap, default on; bench fwd_ms_no_overlap times the old order); (2) the same in waves for
# many documents (kda_forward_overlap_waves, OFF by default: bench fwd_ms_overlap_waves times it);
# (3) both state passes take documents longest first (packed waves). About 95 s of device time.
# 1. Correctness (~35 s): overlap bit for bit against prep-then-state (T8192 H32, T4000 H32 K64),
#    *_noOverlap cases, 8 documents x 32 heads (longest-first order, and the waves overlap), eval/prepared.
timeout 70 $D/bin/gpu_suite --gtest_filter='CudaKdaTcOverlap.*:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/*noOverlap:KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/*docs8_h0_dhT_mild:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/*overlapWaves:KdaTc/CudaKdaTc.TensorCorePrepAgreesWithCudaCorePrep/H2K128V128_T300_docs1_h0_dhT_strong:CudaKdaEval.*:CudaKdaPrepared.*' > "$L/kda15_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|FAILED|Failure|seed=" "$L/kda15_suite.txt" | head -30
# 2. Timing (~20 s): T65536 fwd_ms (overlap) vs fwd_ms_no_overlap; packed fwd_ms vs call 1's 1.740 and
#    fwd_ms_overlap_waves; B2 unchanged (1.38).
timeout 45 $D/bin/moetrain bench kda --iters 5 --warmup 1 --json "$L/kda15_bench_kda.json" > "$L/kda15_kda.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
for r in json.load(open('$L/kda15_bench_kda.json'))['runs']: print(r['case'], {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k.startswith(('fwd', 'launches'))})" 2>&1 | tail -4
# 3. Stall profile of the T65536 forward state pass as main runs it (16 columns a block, no overlap) (~30 s).
timeout 50 ncu --set full --kernel-name regex:fwd_state_v2 --launch-count 1 --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio --export "$L/kda15_ncu_state16" $D/bin/moetrain bench kda --cases B1_T65536 --iters 1 --warmup 0 --no-overlap > "$L/kda15_ncu_state16.txt" 2>&1; echo "ncu rc=$?"
grep -E "fwd_state_v2|Duration|Throughput|Warp Cycles Per Issued|Issue Slots Busy|Achieved Occupancy|Registers|stalled.*ratio" "$L/kda15_ncu_state16.txt" | head -50
