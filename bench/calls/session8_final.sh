#!/usr/bin/env bash
# Session 8, final call (about 380 s of device time left): full test (lora8, ep8, fix8, flash mask,
# KDA W/U), bench moe, step (default, routed-expert LoRA, deterministic), bench kda, world-1
# distributed train over NCCL, bench decode, memcheck. Logs in one tarball.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}; L=/tmp/logs; mkdir -p "$OUT" "$L"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
pack() { tar -C "$L" -czf "$OUT/logs.tgz" .; }
el test; OUT=$L timeout 120 tools/gpu.sh test > "$L/test.txt" 2>&1; tail -2 "$L/test.txt"
grep -E "^FAIL" "$L/test.txt" | cut -c1-300 | head -20; pack
D=/tmp/moetrain-gpu; export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
el moe; timeout 45 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; python3 - "$L" <<'PY'
import json,sys
try:
    j=json.load(open(sys.argv[1]+"/bench_moe.json"))
    for r in j["runs"]: print(r["case"],r["routing"],"fwd %.2f frozen %.2f full %.2f lora %.2f/%.2f ovh %.3f"%(r["fwd_ms"],r["fwdbwd_frozen_ms"],r["fwdbwd_full_ms"],r["lora_fwd_ms"],r["lora_fwdbwd_ms"],r["lora_overhead_fwdbwd"]))
except Exception as e: print("bench moe:", e); print(open(sys.argv[1]+"/moe.txt").read()[-400:])
PY
step() {  # name, extra args
  local n=$1; shift
  el "step $n"; timeout 45 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 \
    --warmup 1 --json "$L/step_$n.json" "$@" > "$L/step_$n.txt" 2>&1 || tail -3 "$L/step_$n.txt"
  python3 - "$L/step_$n.json" <<'PY'
import json,sys
try:
    j=json.load(open(sys.argv[1]))
    print("ms/step", round(j["ms_per_step"],1), [round(x,1) for x in j["ms_steps"]], "GiB", round(j["device_used_gib_over_baseline"],2), "planned", round(j["planner_total_gib"],2), "mfu", round(j["mfu"],3), "trainable", j.get("trainable"), "loss", j.get("loss"))
    print(" ", "; ".join(f'{u["layer"]} {u["fwd_ms"]:.2f}/{u["bwd_ms"]:.2f}' for u in j["profile"]["units"]))
except Exception as e: print("step:", e)
PY
  pack
}
step default
step experts --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts
el kda; timeout 30 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; grep -o '"case":"[^"]*"\|"fwd_ms":[0-9.]*\|"fwdbwd_ms":[0-9.]*' "$L/bench_kda.json" | paste - - -
el dist; if [ -f .gpu/dist.sh ]; then timeout 60 bash .gpu/dist.sh > "$L/dist.txt" 2>&1; echo "dist rc=$?"; tail -6 "$L/dist.txt"; fi; pack
el decode; timeout 40 $D/bin/moetrain bench decode --model bench/models/kimi-linear-8l.json --prompt 512 --tokens 64 \
  --json "$L/decode.json" > "$L/decode.txt" 2>&1; echo "rc=$?"; grep "bench decode" "$L/decode.txt"; grep -o '"greedy_ids_agree_for":[0-9]*' "$L/decode.json"
step deterministic --deterministic
el memcheck; timeout 50 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $D/bin/gpu_suite \
  --gtest_filter="${MEM_FILTER:-CudaLoraGrouped.*:CudaDecodeOps.*}" --gtest_brief=1 > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|FAILED" "$L/memcheck.log" | tail -3
el done; pack; ls -la "$OUT"
