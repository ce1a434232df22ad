#!/usr/bin/env bash
# dsa10 (issue 13), one device call: CudaDsaLong.* (the sparse stage at 131072 tokens on sampled
# rows), the kernels the DSA step model's layers choose, bench step on kimi-linear-8l-dsa at 8192
# and 32768 tokens, and the two-layer DSA model training fully at 131072 tokens (its losses).
# run(command="bash bench/calls/session10_dsa10.sh", carry=[".gpu"]) after packing moetrain and
# gpu_suite into .gpu/pack.tgz (tools/gpu.sh pack, or the same by hand without test_golden).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
summary() {  # bench step JSON -> one line
  python3 - "$1" <<'PY'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    m = j.get("memory_check", {})
    units = [(u["layer"], round(u["fwd_ms"], 1), round(u["bwd_ms"], 1)) for u in j["profile"]["units"]]
    print(f'ms/step {j["ms_per_step"]:.1f} tok/s {j["tokens_per_s"]:.0f} mfu {j["mfu"]:.3f} '
          f'planned {m.get("planned_gib", 0):.2f} measured {m.get("measured_gib", 0):.2f} GiB '
          f'within10% {m.get("within_10pct")} losses {[round(x, 4) for x in j["losses"]]} fell {j["loss_fell"]}')
    print("  units (layer, fwd ms, bwd ms):", units)
except Exception as e:
    print("no result:", e)
PY
}
el long; timeout 240 "$D/bin/gpu_suite" --gtest_filter='CudaDsaLong.*' > "$OUT/dsa_long.txt" 2>&1
echo "rc=$?"; grep -vE "^\[ *(RUN|OK) |^Running main|^$" "$OUT/dsa_long.txt" | tail -45
el info; timeout 60 "$D/bin/moetrain" info bench/models/kimi-linear-8l-dsa.json --device cuda 2>&1 | tail -5
for T in 8192 32768; do
  el "step kimi-linear-8l-dsa $T"
  timeout 200 "$D/bin/moetrain" bench step --model bench/models/kimi-linear-8l-dsa.json --tokens $T \
    --json "$OUT/step_dsa_$T.json" > "$OUT/step_dsa_$T.txt" 2>&1; echo "rc=$?"
  summary "$OUT/step_dsa_$T.json"; grep -iE "error|what" "$OUT/step_dsa_$T.txt" | head -3
done
el "train dsa-2l 131072"
timeout 240 "$D/bin/moetrain" bench step --model bench/models/dsa-2l.json --tokens 131072 --lora-rank 0 \
  --warmup 1 --steps 4 --lr 1e-3 --json "$OUT/step_dsa2l_131072.json" > "$OUT/step_dsa2l_131072.txt" 2>&1
echo "rc=$?"; summary "$OUT/step_dsa2l_131072.json"; grep -E "loss|rror" "$OUT/step_dsa2l_131072.txt" | head -8
el done
