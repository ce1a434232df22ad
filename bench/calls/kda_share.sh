# Sourced by a session's device-call script after lib.sh and unpack: issue 12's KDA core share of
# the training step, before (--kda-kernels direct, ops/cuda/kda.cu) and after (the chunked kernels).
# Each: the step's time without a profiler, then one step under ncu timing only the KDA core's
# kernels (each alone, caches flushed: the sum is an upper bound on their share of the step).
kda_share() {
  local m=bench/models/kimi-linear-8l.json kern
  kern='regex:chunk_table_kernel|prep_tc_kernel|fwd_state_v2_kernel|bwd_pre_tc_kernel|bwd_state_v2_kernel|products_v2_kernel|grads_v2_kernel|dbeta_sum_kernel|kda_fwd_kernel|kda_bwd_kernel'
  for kk in direct chunked; do
    timeout 60 $D/bin/moetrain bench step --model $m --tokens 8192 --steps 2 --warmup 1 \
      --kda-kernels $kk --json "$L/step_$kk.json" > "$L/step_$kk.txt" 2>&1
    echo "step $kk rc=$?"; step_line "$L/step_$kk.json"
    timeout 70 ncu --metrics gpu__time_duration.sum -k "$kern" --csv $D/bin/moetrain bench step \
      --model $m --tokens 8192 --steps 1 --warmup 0 --kda-kernels $kk > "$L/ncu_step_$kk.csv" \
      2> "$L/ncu_step_$kk.err"
    echo "ncu step $kk rc=$?"
    python3 - "$L/ncu_step_$kk.csv" "$L/step_$kk.json" <<'PY' 2>&1 | tail -12
import csv, json, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
s = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
h = rows[s]; ni, vi = h.index("Kernel Name"), h.index("Metric Value")
by = collections.Counter(); n = collections.Counter()
for r in rows[s + 1:]:
    if len(r) < len(h): continue
    k = r[ni].replace("(anonymous namespace)::", "").split("(")[0].split("<")[0].split("::")[-1]
    by[k] += float(r[vi].replace(",", "")) / 1e6; n[k] += 1
step = json.load(open(sys.argv[2]))["ms_per_step"]
fwd = max(n.get("kda_fwd_kernel", 0), n.get("fwd_state_v2_kernel", 0))
steps = fwd / 6.0 if fwd else 1  # six KDA layers per step
tot = sum(by.values()) / steps
for k, v in by.most_common(): print(f"  {k:24s} {v / steps:8.2f} ms/step {n[k] / steps:4.0f} launches/step")
print(f"KDA core {tot:.2f} ms of a {step:.1f} ms step ({steps:.0f} steps under ncu): {100 * tot / step:.1f}%")
PY
  done
}
