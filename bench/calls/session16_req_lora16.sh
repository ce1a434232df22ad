# lora16 (branch lora16, commit 76905a8 or later: `git log lora16 -1`): expert-LoRA overhead (issue 14).
# The K-concatenation path's SwiGLU passes are selectable per pass (GroupedFfnParams::lora_fwd / lora_bwd:
# separate = session 13's passes, staged = session 14's shared-memory kernels, registers = NEW: warps form the
# rank-16 MMA fragments in registers). Default now registers / registers; bench moe times the other kernels of
# each pass in the same run (lora_fwd_<k>_*, lora_bwd_<k>_*) beside lora_s13_* (session 15 call 3 at A: the
# s14 staged kernels 7.71 ms, session 13's 7.30: the staged kernels were the slow part). About 95 s.
# Also lora_out_grads (dr, dB over dY): separate / staged (default) / registers (NEW, timed as lora_og_registers_*).
# 1. Correctness (~25 s): the new kernels against the CPU composites (skewed groups, partial tiles, ranks 8-64),
#    the op end to end on the K-concatenation path (default = registers; staged fwd / separate bwd; og registers),
#    and the out_grads pass through the register form at ranks 8-32.
timeout 50 $D/bin/gpu_suite --gtest_filter='CudaLoraGrouped.FusedSwigluKernelsAgainstTheCpuComposites:CudaGroupedFfn.KConcatLoraInTheBaseGemms:CudaGroupedFfn.SwigluExpertsWithLoraForwardBackward:CudaGroupedFfn.LoraBackwardOnePassOverDout' > "$L/lora16_suite.txt" 2>&1; echo "suite rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|FAILED|Failure|seed=|Expected|Which is|worst|max" "$L/lora16_suite.txt" | head -40
# 2. Timing (~25 s): lora_fwdbwd_ms (registers/registers) vs the variants, s13 and the frozen base.
timeout 50 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --iters 5 --json "$L/lora16_bench.json" > "$L/lora16_bench.txt" 2>&1; rc=$?; echo "bench rc=$rc"
if [ $rc -ne 0 ]; then  # a fault in a new kernel: the old kernels alone, so that the call still measures something
  tail -5 "$L/lora16_bench.txt"
  timeout 30 $D/bin/moetrain bench moe --cases A:uniform,B:uniform --iters 5 --lora-fwd staged --lora-bwd staged --lora-og staged --lora-variants fwd=separate,bwd=separate,og=separate --json "$L/lora16_bench_safe.json" > "$L/lora16_bench_safe.txt" 2>&1; echo "bench safe rc=$?"
fi
python3 -c "
import json, glob
for f in sorted(glob.glob('$L/lora16_bench*.json')):
  for r in json.load(open(f))['runs']: print(f.split('/')[-1], r['case'], 'frozen %.3f' % r['fwdbwd_frozen_ms'], {k: round(v, 3) for k, v in r.items() if k.startswith('lora') and isinstance(v, float)})" 2>&1 | tail -6
# 3. Per-launch times of the LoRA kernels at A (~35 s; the CUTLASS GEMMs and routing left out by the filter):
#    in launch order: frozen swiglu, lora fwd (registers), fwd+bwd (registers), s13, then the variants fwd=staged,
#    bwd=staged, og=registers (each its fwd, then fwd+bwd), separate.
timeout 45 ncu --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv -k regex:'regs_kernel|swiglu|lora_pack|down_kernel|dw_kernel|out_grads|up_kernel|for_each_index' $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 0 --lora-variants fwd=staged,bwd=staged,og=registers > "$L/lora16_ncu.csv" 2> "$L/lora16_ncu.err"; echo "ncu rc=$?"
python3 - "$L/lora16_ncu.csv" <<'PY' 2>&1 | tail -90
import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ix = {k: h.index(k) for k in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Value")}
by = collections.OrderedDict()
for r in rows[1:]:
    n = re.sub(r"^void |mt::ops::cuda::|\(anonymous namespace\)::|<unnamed>::|\(.*$", "", r[ix["Kernel Name"]])[:44]
    k = (r[ix["ID"]], n, r[ix["Grid Size"]]); by.setdefault(k, {})[r[ix["Metric Name"]]] = float(r[ix["Metric Value"]].replace(",", ""))
for (i, n, gsz), m in by.items():
    t = m.get("gpu__time_duration.sum", 0); b = m.get("dram__bytes_read.sum", 0) + m.get("dram__bytes_write.sum", 0)
    print(f"{i:>4} {n:44s} {gsz:>14s} {t/1e3:8.1f} us rd {m.get('dram__bytes_read.sum',0)/1e6:7.1f} wr {m.get('dram__bytes_write.sum',0)/1e6:7.1f} MB {b/t if t else 0:7.1f} GB/s")
PY
