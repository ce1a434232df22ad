#!/usr/bin/env bash
# Session 22, call 1 (issue 14): branch next21 (tiles past n-block 0 skip the side slice by
# mbarrier.complete_tx; the n-block-0 tiles count xa / dr once per warp; n-block 0 leaves dB to the
# other n-blocks) against main's binary (613d6b7, carried as .gpu/moetrain_main.xz) in one call:
# tests and sanitizers on next21, ncu per kernel at B and A uniform for both, bench moe on the
# uniform cases for both (alternating), then all four cases for next21 against torch.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
xz -dc .gpu/moetrain_main.xz > $D/bin/moetrain_main 2>/dev/null ||
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .gpu/moetrain_main.xz $D/bin/moetrain_main
chmod +x $D/bin/moetrain_main
budget=560
el test; timeout 110 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
f='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop:CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms'
for tool in memcheck synccheck; do
  el $tool; timeout 60 compute-sanitizer --tool $tool $D/bin/gpu_suite --gtest_filter="$f" > "$L/$tool.txt" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/$tool.txt" | head -3; pack
done
for c in B A; do
  for b in moetrain moetrain_main; do
    el "ncu $c $b"; timeout 40 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/$b bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_${c}_$b.csv" 2> "$L/ncu_${c}_$b.err"; echo "ncu rc=$?"; pack
  done
done
for r in 1 2; do
  for b in moetrain moetrain_main; do
    el "moe uniform $b round $r"; timeout 70 $D/bin/$b bench moe --cases A:uniform,B:uniform --iters 10 --lora-variants none --json "$L/uni_${b}_$r.json" > "$L/uni_${b}_$r.txt" 2>&1; echo "rc=$?"; pack
  done
done
l=$(left); el "moe all (${l}s left)"
timeout $(( l - 50 )) $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 45 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch; pack
python3 - "$L" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + '/uni_*.json')):
    for r in json.load(open(f))['runs']:
        print(f.split('/')[-1], r['case'], 'fwd %.3f frozen %.3f written %.3f lora %.3f median +%.1f%%' % (r['fwd_ms'], r['fwdbwd_frozen_ms'], r['fwdbwd_full_written_ms'], r['lora_fwdbwd_ms'], 100 * r.get('lora_overhead_fwdbwd_median', float('nan'))))
PY
el done
