set -u
: "${D:?}" "${L:?}"
# moe14 (branch moe14 at its latest commit; rows run from the repository root, binaries in $D/bin, logs in $L/).
# ~70 s: the LoRA device tests, bench moe at A/B uniform (lora_fwdbwd_ms = new kernels, lora_s13_fwdbwd_ms
# = session 13's in the same run), then a per-launch ncu of the LoRA kernels only.
timeout 60 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.KConcat*:CudaGroupedFfn.LoraBackwardOnePassOverDout:CudaLoraGrouped.*:CudaGroupedFfn.SwigluExpertsWithLoraForwardBackward:CudaGroupedFfn.SkinnyLoraPathRanks16And32:CudaGroupedFfn.WeightGradsWrittenUnderTheZeroHint' > "$L/moe14_suite.txt" 2>&1; echo "suite rc=$?"; grep -E "^\[  (PASSED|FAILED)|Failure|seed=" "$L/moe14_suite.txt" | head -20
timeout 40 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --json "$L/moe14_bench.json" > "$L/moe14_bench.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
for r in json.load(open('$L/moe14_bench.json'))['runs']: print(r['case'], 'frozen %.3f lora %.3f (+%.1f%%) s13 %.3f (+%.1f%%) lora_fwd %.3f'%(r['fwdbwd_frozen_ms'],r['lora_fwdbwd_ms'],100*r['lora_overhead_fwdbwd'],r.get('lora_s13_fwdbwd_ms',0),100*r.get('lora_s13_overhead_fwdbwd',0),r['lora_fwd_ms']))" 2>&1 | tail -3
timeout 45 ncu --metrics gpu__time_duration.sum --csv -k regex:'out_grads|lora_pack|down_kernel|dw_kernel|swiglu|up_kernel|for_each_index' $D/bin/moetrain bench moe --cases A:uniform,B:uniform --iters 1 --warmup 0 > "$L/moe14_ncu.csv" 2> "$L/moe14_ncu.err"; echo "ncu rc=$?"
