# dsa15 (branch dsa15, build commit 42472a9 or `git log dsa15 -1`): the sparse MQA backward and prob
# sum on wgmma, two new SparseMqaKernels generations (neither the default; both Wgmma2's forward):
# Wgmma3 (key gradient by float4 reds, as Split) and Wgmma4 (by bulk reductions from shared
# memory). Run from the repository root, binaries in $D/bin, logs to $L/. About 90 s of device time.
# 1. Correctness (~55 s): the cases that run both new generations in full (o, lse, prob_sum, dq,
#    dkv, the backward's target) next to Split / Chained / Wgmma / Wgmma2.
timeout 65 $D/bin/gpu_suite --gtest_filter='CudaSparseMqa.Heads16_32_64:CudaSparseMqa.WgmmaTileEdges:CudaSparseMqa.SanitizerSizedWgmma' > "$L/dsa15_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|FAILED|Failure|seed|wgmma[34]|rel err|worst" "$L/dsa15_suite.txt" | head -60
# 2. Timing (~25 s): mqa_bwd_ms_wgmma3 and mqa_bwd_ms_wgmma4 against mqa_bwd_ms_split, one run.
timeout 35 $D/bin/moetrain bench dsa --tokens 8192 --iters 2 --json "$L/dsa15_bench_dsa.json" > "$L/dsa15_dsa.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
for r in json.load(open('$L/dsa15_bench_dsa.json'))['runs']: print(r['T'], {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k.startswith('mqa_')})" 2>&1 | tail -3
# 3. OPTIONAL, only if the budget allows (~20 s): one launch of Wgmma3's backward (the first
#    mqa_bwd_wgmma launch of bench dsa), for the reds' L2 rate and the stalls.
# timeout 30 ncu --kernel-name regex:mqa_bwd_wgmma_kernel --launch-count 1 --section SpeedOfLight --section WarpStateStats --metrics lts__t_sectors_op_red.sum,lts__t_requests_op_red.sum,smsp__inst_executed_op_global_red.sum $D/bin/moetrain bench dsa --tokens 8192 --iters 1 > "$L/dsa15_ncu_bwd.txt" 2>&1; echo "ncu rc=$?"
# grep -E "mqa_bwd_wgmma|Duration|Throughput|Warp Cycles Per Issued|Stall|op_red" "$L/dsa15_ncu_bwd.txt" | head -40
