#!/usr/bin/env bash
# Session 10, call 1 (main at the commit that packed it): gpu_suite over the commits of session 9
# that had not run on a GPU; Nsight Compute per-kernel times of bench moe (A uniform: frozen,
# full and LoRA runs) and of bench kda; bench dsa after dsa9b. Logs in one tarball.
set -u
cd "$(dirname "$0")/.."
. bench/calls/lib.sh
el test; OUT=$L timeout 220 tools/gpu.sh test > "$L/test.txt" 2>&1; tail -2 "$L/test.txt"
grep -E "^FAIL|\[  FAILED" "$L/test.txt" | cut -c1-300 | head -30; pack
export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}  # tools/gpu.sh test unpacked into $D
el dsa; timeout 60 $D/bin/moetrain bench dsa --tokens 8192,32768 --json "$L/bench_dsa.json" > "$L/dsa.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/bench_dsa.json'))['runs']: print({k:(round(v,2) if isinstance(v,float) else v) for k,v in r.items()})" 2>&1 | cut -c1-700; pack
el ncu moe; timeout 150 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases A:uniform --iters 1 --warmup 1 > "$L/ncu_moe.csv" 2> "$L/ncu_moe.log"; echo "rc=$?"; tail -2 "$L/ncu_moe.log"; pack
el ncu kda; timeout 150 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.log"; echo "rc=$?"; tail -2 "$L/ncu_kda.log"; pack
el moe; timeout 60 $D/bin/moetrain bench moe --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"; pack
el done; ls -la "$OUT"
