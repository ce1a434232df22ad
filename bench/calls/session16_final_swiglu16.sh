# swiglu16 final (branch swiglu16, head a5fa72a, rebased on main efbea23): SwiGLU in the grouped GEMMs'
# epilogues, still OFF by default (GroupedGemmConfig::kDefaultSwigluFwd/Bwd), selectable by the
# configuration parts :swiglu / :swiglu=fwd / :swiglu=bwd (:narrow = 4-byte pair accesses).
# Since the mid call (a79a486, slower everywhere): sigmoid by __expf + __fdividef once an element
# (was IEEE expf + division twice), the quad's 16-byte loads/stores. ~75 s. Binaries in $D/bin, logs to $L/.
# 1. Correctness (~25 s): as in the mid call (it passed then) plus the config names with :swiglu=off.
timeout 70 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.FusedSwiglu*:CudaGroupedFfn.SwigluInTheGemmEpilogues:CudaGroupedGemmConfig.NamesRoundTrip*' > "$L/swiglu16f_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|^\[       OK|FAILED|Failure|seed|taken" "$L/swiglu16f_suite.txt" | head -30
# 2. Timing (~40 s): default vs fused backward / forward / both (quad), both narrow, backward on ping-pong.
timeout 90 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --base-only --iters 5 --gemm coop128x256c2x1,coop128x256c2x1:swiglu=bwd,coop128x256c2x1:swiglu=fwd,coop128x256c2x1:swiglu,coop128x256c2x1:swiglu=bwd:narrow,coop128x256c2x1:dx=pingpong128x128c2x1:swiglu=bwd --json "$L/swiglu16f_moe.json" > "$L/swiglu16f_moe.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
for r in json.load(open('$L/swiglu16f_moe.json'))['runs']: print(r['case'], r['grouped_gemm'], {k: round(v, 3) for k, v in r.items() if k.endswith('_ms')})" 2>&1 | tail -12
# 3. OPTIONAL (~15 s): one launch of the fused backward kernel (SwigluNode<true>) at A, for where its
#    epilogue's time goes (issue stalls vs memory).
# timeout 60 ncu --kernel-name-base demangled --kernel-name regex:'SwigluNode<true>' --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --metrics gpu__time_duration.sum,dram__bytes.sum $D/bin/moetrain bench moe --cases A:uniform --base-only --iters 1 --warmup 0 --gemm coop128x256c2x1:swiglu=bwd > "$L/swiglu16f_ncu.txt" 2>&1; echo "ncu rc=$?"
# grep -E "gpu__time_duration|dram__bytes|Throughput|Issue Slots|Stall|Warp Cycles" "$L/swiglu16f_ncu.txt" | head -30
