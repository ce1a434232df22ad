#!/usr/bin/env bash
# Session 9, call 3 (main at 82c6b7e: kda9b's backward products on tensor cores): gpu_suite,
# bench kda and fla's chunk_kda in the same call, compute-sanitizer over this session's new
# kernels, the step.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}; L=/tmp/logs; mkdir -p "$OUT" "$L"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
pack() { tar -C "$L" -czf "$OUT/logs.tgz" .; }
el test; OUT=$L timeout 200 tools/gpu.sh test > "$L/test.txt" 2>&1; tail -2 "$L/test.txt"
grep -E "^FAIL" "$L/test.txt" | cut -c1-400 | head -30; grep -h "tc vs cuda cores\|products" "$L/gpu_suite.log" | head -12; pack
D=/tmp/moetrain-gpu; export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
el kda; timeout 40 $D/bin/moetrain bench kda --json "$L/bench_kda.json" > "$L/kda.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_kda.json'))['runs']: print(r['case'], 'fwd %.2f fwdbwd %.2f'%(r['fwd_ms'],r['fwdbwd_ms']), r.get('prep_path'))"; pack
el fla; python3 -m pip install --no-index --no-deps .gpu/wheels/*.whl > "$L/pip.log" 2>&1 || tail -3 "$L/pip.log"
timeout 170 python3 bench/kda_fla.py > "$L/kda_fla.jsonl" 2> "$L/kda_fla.err"; echo "fla rc=$?"; cut -c1-300 "$L/kda_fla.jsonl"; tail -2 "$L/kda_fla.err"; pack
el memcheck; timeout 100 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $D/bin/gpu_suite \
  --gtest_filter='CudaSparseMqa*:CudaKdaTc*:CudaGroupedGemmConfig*:CudaGroupedFfn*:CudaLoraGrouped*' --gtest_brief=1 > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|FAILED|PASSED" "$L/memcheck.log" | tail -4; pack
el racecheck; timeout 80 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite \
  --gtest_filter='CudaSparseMqa*:CudaKdaTcPrepared*' --gtest_brief=1 > "$L/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|FAILED|PASSED|hazard" "$L/racecheck.log" | tail -4; pack
el step; timeout 60 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1 || tail -3 "$L/step.txt"
python3 - "$L/step.json" <<'PY'
import json,sys
try:
    j=json.load(open(sys.argv[1]))
    print("ms/step", round(j["ms_per_step"],1), [round(x,1) for x in j["ms_steps"]], "tok/s", round(j["tokens_per_s"]), "GiB", round(j["device_used_gib_over_baseline"],2), "planned", round(j["planner_total_gib"],2), "loss", j.get("loss"))
    print(" ", "; ".join(f'{u["layer"]} {u["fwd_ms"]:.2f}/{u["bwd_ms"]:.2f}' for u in j["profile"]["units"]))
except Exception as e: print("step:", e)
PY
el done; pack; ls -la "$OUT"
