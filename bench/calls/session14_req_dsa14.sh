set -u
: "${D:?}" "${L:?}"
# dsa14 (branch dsa14, commit in `git log dsa14 -1`): the sparse MQA forward on wgmma
# (SparseMqaKernels::Wgmma). Run from the repository root with the packed binaries in $D/bin,
# logs to $L/. About 80 s: four CudaSparseMqa tests (each case on Split, Chained and Wgmma;
# LargerSelection left out for time, ~65 s alone) and bench dsa at 8K (mqa_fwd_ms_wgmma beside
# mqa_fwd_ms_split / _chained; the layer timings once more with --mqa-kernels wgmma would cost
# another run, so not here).
timeout 60 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa.Heads16_32_64:CudaSparseMqa.PaddedHeadBlocks:CudaSparseMqa.SplitTileEdges:CudaSparseMqa.WgmmaTileEdges' > "$L/dsa14_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|OK|FAILED|Failure|seed|wgmma" "$L/dsa14_suite.txt" | head -40
timeout 45 $D/bin/moetrain bench dsa --tokens 8192 --iters 3 --json "$L/dsa14_bench_dsa.json" > "$L/dsa14_dsa.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
for r in json.load(open('$L/dsa14_bench_dsa.json'))['runs']: print(r['T'], {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k.startswith('mqa_')})" 2>&1 | tail -3
# Optional (drop it if over budget): one wgmma forward launch under ncu at 8K (is it bound by the
# gather's L2 traffic, as estimated, or by the one warpgroup's serial chain?).
timeout 30 ncu --kernel-name regex:mqa_fwd_wgmma --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy $D/bin/moetrain bench dsa --tokens 8192 --iters 1 > "$L/dsa14_ncu_fwd.txt" 2>&1; echo "ncu rc=$?"
grep -E "Duration|Throughput|L2 Cache Throughput|Stall|Registers|Achieved Occupancy" "$L/dsa14_ncu_fwd.txt" | head -30
