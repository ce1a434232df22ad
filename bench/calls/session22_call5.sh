#!/usr/bin/env bash
# Session 22, call 5 (issue 14): the fused LoRA GEMMs with each group's n-block-0 problem listed a
# wave of tiles ahead of its others (branch skew22) against main's binary (7751b98, carried as
# .gpu/moetrain_main.xz) in one call: tests and sanitizers on skew22 (the fused cases now with 160
# experts), ncu per kernel at B and A uniform for both, bench moe on all four cases for both, torch,
# then the expert-LoRA step on skew22.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
xz -dc .gpu/moetrain_main.xz > $D/bin/moetrain_main 2>/dev/null ||
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .gpu/moetrain_main.xz $D/bin/moetrain_main
chmod +x $D/bin/moetrain_main
budget=420
el test; timeout 120 $D/bin/gpu_suite --gtest_filter='CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaModel*:CudaGroupedGemmConfig.*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed=|Expected|exception" "$L/suite.txt" | head -12; pack
f='CudaGroupedFfn.DownDxGemmFormsDrAndDbInItsMainloop:CudaGroupedFfn.GateUpGemmFormsXaInItsMainloop:CudaGroupedFfn.KConcatLoraInTheBaseGemms'
for tool in memcheck synccheck; do
  el $tool; timeout 70 compute-sanitizer --tool $tool $D/bin/gpu_suite --gtest_filter="$f" > "$L/$tool.txt" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED)" "$L/$tool.txt" | head -3; pack
done
for c in B A; do
  for b in moetrain moetrain_main; do
    el "ncu $c $b"; timeout 40 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/$b bench moe --cases $c:uniform --iters 1 --warmup 0 --lora-variants none > "$L/ncu_${c}_$b.csv" 2> "$L/ncu_${c}_$b.err"; echo "ncu rc=$?"; pack
  done
done
for b in moetrain moetrain_main; do
  el "moe all $b"; timeout 70 $D/bin/$b bench moe --iters 10 --lora-variants none --json "$L/all_$b.json" > "$L/all_$b.txt" 2>&1; echo "rc=$?"; pack
done
timeout 45 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
cp "$L/all_moetrain.json" "$L/bench_moe.json"; echo "skew22:"; moe_vs_torch
cp "$L/all_moetrain_main.json" "$L/bench_moe.json"; echo "main:"; moe_vs_torch; pack
l=$(left); el "step (${l}s left)"
if [ "$l" -gt 60 ]; then
  timeout $(( l - 10 )) $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
fi
el done
