#!/usr/bin/env bash
# Session 9, call 0: gpu_suite at 51d50cc (dedup8 refactors never ran on a GPU), ncu per-kernel times of
# `bench kda --iters 1` (for the KDA redesign), the world-1 distributed CLI check with its metrics.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}; L=/tmp/logs; mkdir -p "$OUT" "$L"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
pack() { tar -C "$L" -czf "$OUT/logs.tgz" .; }
el test; OUT=$L timeout 120 tools/gpu.sh test > "$L/test.txt" 2>&1; tail -2 "$L/test.txt"
grep -E "^FAIL" "$L/test.txt" | cut -c1-300 | head -20; pack
D=/tmp/moetrain-gpu; export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
el ncu-kda; timeout 120 ncu --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench kda --iters 1 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.err"
echo "ncu rc=$?"; python3 tools/ncu_by_kernel.py "$L/ncu_kda.csv" 1 25 | tee "$L/ncu_kda.txt" | head -30; pack
el dist; sed -i 's|rm -rf "$T";|cp -r "$T/mesh" /tmp/logs/mesh_run 2>/dev/null; rm -rf "$T";|' tests/parallel/cli_setup.sh; export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 60 bash tests/cuda/gpu_mesh_cli_check.sh $D/bin/moetrain mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH > "$L/dist.txt" 2>&1; echo "dist rc=$?"; tail -4 "$L/dist.txt"
rm -rf $L/mesh_run/checkpoints; tail -c 1500 $L/mesh_run/metrics.jsonl
el done; pack; ls -la "$OUT"
