# lora16 for the final device call (branch lora16, 6566377 or later; rows from the repository root, binaries in $D/bin,
# logs to $L/). About 100 s. Defaults now: fwd Registers, bwd Separate, out_grads Staged, xa Staged (the
# mid-call's fastest); the prefetching register backward / out_grads and the register X A^T are timed beside
# them (lora_bwd_registers_*, lora_og_registers_*, lora_xa_registers_*): if one beats lora_fwdbwd_ms at both
# A and B, flip its default in src/ops/grouped_ffn.h (GroupedFfnParams::lora_bwd / lora_out_grads / lora_xa).
# 1. Correctness (~60 s): the register kernels against the CPU composites, the op end to end (every LoRA
#    kernel choice), the MoE layer.
timeout 120 $D/bin/gpu_suite --gtest_filter='CudaLoraGrouped.*:CudaGroupedFfn.*:*CudaMoe*' > "$L/lora16_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|FAILED|Failure|seed=|Expected|Which is" "$L/lora16_suite.txt" | head -30
# 2. Timing (~25 s): frozen vs LoRA (default) vs every other kernel choice, same run.
timeout 60 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --iters 5 --json "$L/lora16_bench.json" > "$L/lora16_bench.txt" 2>&1; echo "bench rc=$?"
python3 -c "
import json
for r in json.load(open('$L/lora16_bench.json'))['runs']:
  fr = r['fwdbwd_frozen_ms']; print(r['case'], 'frozen %.3f lora %.3f (+%.1f%%)' % (fr, r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd']))
  for k in sorted(r):
    if k.endswith('_fwdbwd_ms') and k.startswith('lora_') and k != 'lora_fwdbwd_ms': print('   %-26s %.3f (+%.1f%%)' % (k[:-10], r[k], 100 * (r[k] / fr - 1)))" 2>&1 | tail -30
