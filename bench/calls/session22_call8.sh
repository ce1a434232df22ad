#!/usr/bin/env bash
# Session 22, call 8 (issue 14): branch next22 (SwiGLU's backward forms dA_down beside dgate_up)
# against main's binary (7751b98's kernels, carried as .gpu/moetrain_main.xz): the LoRA, fused and
# model device tests, ncu per kernel at B uniform for both, bench moe at A and B uniform for both.
# Sized for the session's last ~200 s of device time.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
xz -dc .gpu/moetrain_main.xz > $D/bin/moetrain_main 2>/dev/null ||
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .gpu/moetrain_main.xz $D/bin/moetrain_main
chmod +x $D/bin/moetrain_main
budget=180
el test; timeout 70 $D/bin/gpu_suite --gtest_filter='CudaLoraGrouped.FusedSwiglu*:CudaGroupedFfn.*Lora*:CudaGraph.GroupedFfnLora*:CudaModel.Bf16ExpertLoraKConcatenatedStaysWithinTheModelBound:CudaModel.LoraStepMatchesTheCpu' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
for b in moetrain moetrain_main; do
  el "ncu B $b"; timeout 25 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/$b bench moe --cases B:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_B_$b.csv" 2> "$L/ncu_B_$b.err"; echo "ncu rc=$?"; pack
done
for b in moetrain moetrain_main; do
  l=$(left); [ "$l" -gt 25 ] || break
  el "moe uniform $b"; timeout $(( l > 45 ? 40 : l - 5 )) $D/bin/$b bench moe --cases A:uniform,B:uniform --iters 10 --lora-variants none --json "$L/uni_$b.json" > "$L/uni_$b.txt" 2>&1; echo "rc=$?"; pack
done
python3 - "$L" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + '/uni_*.json')):
    try: runs = json.load(open(f))['runs']
    except Exception as e: print(f, e); continue
    for r in runs:
        print(f.split('/')[-1], r['case'], 'fwd %.3f frozen %.3f lora %.3f median +%.1f%%' % (r['fwd_ms'], r['fwdbwd_frozen_ms'], r['lora_fwdbwd_ms'], 100 * r.get('lora_overhead_fwdbwd_median', float('nan'))))
PY
el done
