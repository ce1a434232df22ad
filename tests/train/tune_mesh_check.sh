#!/usr/bin/env bash
# `moetrain tune` under mpirun -np 2 on the tiny-code job, the mesh's expert parallelism and
# all-to-all chunks the grid: both ranks run each trial together and take the same decisions (the
# run ends, exit 0), rank 0 alone prints the trials and writes the JSON, whose best is the fastest
# trial. Usage: tune_mesh_check.sh MOETRAIN MPIRUN... (the mpirun command with its flags)
set -euo pipefail
bin=$1; shift
mpirun=("$@")
source "$(dirname "$0")/../parallel/cli_setup.sh"
fail() { echo "FAIL: $*"; exit 1; }

"${mpirun[@]}" -np 2 "$bin" tune "${S[@]}" --space "parallel.ep=1,2;parallel.a2a_chunks=1,2" \
  --trials 4 --steps 2 --warmup 1 --initial 1 --min-gain 0 --out "$T/tune.json" >"$T/tune.log"
cat "$T/tune.log"
[ "$(grep -c '^trial ' "$T/tune.log")" = 4 ] || fail "expected 4 trial lines, each once (rank 0)"
! grep -q 'failed' "$T/tune.log" || fail "a trial failed"
grep -q '^use: --set parallel.ep=[12] --set parallel.a2a_chunks=[12]$' "$T/tune.log" ||
  fail "no --set line for the best setting"
python3 - "$T/tune.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
times = [t["step_seconds"] for t in j["trials"]]
assert len(times) == 4 and all(t > 0 for t in times), j
assert j["best"]["step_seconds"] == min(times), j
assert sorted(tuple(t["overrides"]) for t in j["trials"]) == sorted(
    (f"parallel.ep={e}", f"parallel.a2a_chunks={c}") for e in (1, 2) for c in (1, 2)), j
assert j["stopped"] == "exhausted", j
PY
echo "tune_mesh_check: ok"
