#!/usr/bin/env bash
# Session 9, call 2 (main with ov9, kda9, dsa9 merged, moe9's fixed branch): gpu_suite, bench moe +
# torch._grouped_mm, bench dsa + the plain-PyTorch DSA, the overlap table, the step (default and
# expert LoRA). Logs in one tarball.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}; L=/tmp/logs; mkdir -p "$OUT" "$L"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
pack() { tar -C "$L" -czf "$OUT/logs.tgz" .; }
el test; OUT=$L timeout 200 tools/gpu.sh test > "$L/test.txt" 2>&1; tail -2 "$L/test.txt"
grep -E "^FAIL" "$L/test.txt" | cut -c1-400 | head -30; pack
D=/tmp/moetrain-gpu; export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
el moe; timeout 60 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
python3 - "$L" <<'PY'
import json,sys
L=sys.argv[1]
try:
    t={}
    for line in open(L+"/moe_torch.jsonl"):
        if line.startswith("{"):
            r=json.loads(line); t[(r.get("case"),r.get("routing"))]=r
    j=json.load(open(L+"/bench_moe.json"))
    for r in j["runs"]:
        a=t.get((r["case"],r["routing"]),{})
        def ratio(k1,k2):
            return "%.2fx"%(a[k2]/r[k1]) if k2 in a else "-"
        print(r["grouped_gemm"],r["case"],r["routing"],"fwd %.2f frozen %.2f full %.2f lora %.2f/%.2f ovh %+.0f%% | torch %s | x %s %s %s"%(r["fwd_ms"],r["fwdbwd_frozen_ms"],r["fwdbwd_full_ms"],r["lora_fwd_ms"],r["lora_fwdbwd_ms"],100*r["lora_overhead_fwdbwd"], {k:round(v,2) for k,v in a.items() if k.endswith("_ms")}, ratio("fwd_ms","fwd_ms"),ratio("fwdbwd_frozen_ms","fwdbwd_frozen_ms"),ratio("fwdbwd_full_ms","fwdbwd_full_ms")))
except Exception as e: print("moe:", e); print(open(L+"/moe.txt").read()[-600:]); print(open(L+"/moe_torch.err").read()[-600:])
PY
pack
el dsa; timeout 60 $D/bin/moetrain bench dsa --tokens 8192,32768 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa.json'))['runs']: print({k:(round(v,2) if isinstance(v,float) else v) for k,v in r.items()})" 2>&1 | cut -c1-600
timeout 90 python3 bench/dsa_torch.py --tokens 8192,32768 > "$L/dsa_torch.json" 2> "$L/dsa_torch.err"; echo "dsa torch rc=$?"; cut -c1-800 "$L/dsa_torch.json"; tail -2 "$L/dsa_torch.err"; pack
el overlap; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 90 bash tests/cuda/gpu_overlap_check.sh $D/bin/moetrain mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH > "$L/overlap.txt" 2>&1; echo "overlap rc=$?"; tail -9 "$L/overlap.txt"; pack
step() {  # name, extra args
  local n=$1; shift
  el "step $n"; timeout 60 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 \
    --warmup 1 --json "$L/step_$n.json" "$@" > "$L/step_$n.txt" 2>&1 || tail -3 "$L/step_$n.txt"
  python3 - "$L/step_$n.json" <<'PY'
import json,sys
try:
    j=json.load(open(sys.argv[1]))
    print("ms/step", round(j["ms_per_step"],1), [round(x,1) for x in j["ms_steps"]], "tok/s", round(j["tokens_per_s"]), "GiB", round(j["device_used_gib_over_baseline"],2), "planned", round(j["planner_total_gib"],2), "trainable", j.get("trainable"), "loss", j.get("loss"))
    print(" ", "; ".join(f'{u["layer"]} {u["fwd_ms"]:.2f}/{u["bwd_ms"]:.2f}' for u in j["profile"]["units"]))
except Exception as e: print("step:", e)
PY
  pack
}
step default
step experts --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts
el done; pack; ls -la "$OUT"
