#!/usr/bin/env bash
# Session 9, call 1 (int9 = main + ov9 + kda9 + moe9 + dsa9 as committed at 13:55): the whole
# gpu_suite with the helpers' new tests, bench kda (tensor-core prep), bench moe under the five
# grouped GEMM configurations, bench dsa (absorbed MQA), the overlap check, one step.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}; L=/tmp/logs; mkdir -p "$OUT" "$L"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
pack() { tar -C "$L" -czf "$OUT/logs.tgz" .; }
el test; OUT=$L timeout 200 tools/gpu.sh test > "$L/test.txt" 2>&1; tail -2 "$L/test.txt"
grep -E "^FAIL" "$L/test.txt" | cut -c1-400 | head -30; pack
D=/tmp/moetrain-gpu; export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
el kda; timeout 40 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
grep -o '"case":"[^"]*"\|"fwd_ms":[0-9.]*\|"fwdbwd_ms":[0-9.]*\|"prep_path":"[^"]*"' "$L/bench_kda.json" | paste - - - - ; tail -2 "$L/kda.txt"; pack
el moe; timeout 150 $D/bin/moetrain bench moe --gemm coop128x256c2x1,coop128x256c1x2,coop256x128c2x1,pingpong128x128c2x1,pingpong64x256c2x1 --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"; python3 - "$L" <<'PY'
import json,sys
try:
    j=json.load(open(sys.argv[1]+"/bench_moe.json"))
    for r in j["runs"]: print(r.get("gemm"),r["case"],r["routing"],"fwd %.2f frozen %.2f full %.2f lora %.2f/%.2f ovh %.3f"%(r["fwd_ms"],r["fwdbwd_frozen_ms"],r["fwdbwd_full_ms"],r["lora_fwd_ms"],r["lora_fwdbwd_ms"],r["lora_overhead_fwdbwd"]))
except Exception as e: print("bench moe:", e); print(open(sys.argv[1]+"/moe.txt").read()[-600:])
PY
pack
el dsa; timeout 90 $D/bin/moetrain bench dsa --tokens 8192,32768 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"; grep -v "^{" "$L/dsa.txt" | tail -12; pack
el overlap; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 90 bash tests/cuda/gpu_overlap_check.sh $D/bin/moetrain mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH > "$L/overlap.txt" 2>&1; echo "overlap rc=$?"; tail -8 "$L/overlap.txt"; pack
el step; timeout 60 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1 || tail -3 "$L/step.txt"
python3 - "$L/step.json" <<'PY'
import json,sys
try:
    j=json.load(open(sys.argv[1]))
    print("ms/step", round(j["ms_per_step"],1), [round(x,1) for x in j["ms_steps"]], "GiB", round(j["device_used_gib_over_baseline"],2), "planned", round(j["planner_total_gib"],2), "loss", j.get("loss"))
    print(" ", "; ".join(f'{u["layer"]} {u["fwd_ms"]:.2f}/{u["bwd_ms"]:.2f}' for u in j["profile"]["units"]))
except Exception as e: print("step:", e)
PY
el done; pack; ls -la "$OUT"
