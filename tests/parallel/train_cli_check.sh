#!/usr/bin/env bash
# `moetrain train` under mpirun against one process, end to end on a small prepared dataset:
#   4 ranks (EP 4, 2 all-to-all chunks) give the one-process losses and held-out loss;
#   the mesh banner is printed once; metrics carry the aggregated communication;
#   the sharded step-4 checkpoint of the 4-rank run resumes on 2 ranks (EP 2) and on one process,
#   and a one-process checkpoint resumes on 2 ranks, each equal to the uninterrupted runs.
# Usage: train_cli_check.sh MOETRAIN MPIRUN... (the mpirun command with its flags)
set -euo pipefail
bin=$1; shift
mpirun=("$@")
src=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
tol=1e-5

"$bin" data prepare "$src/src" --ext .h --max-bytes 150000 --vocab 384 --seq 64 --out "$T/data" >/dev/null 2>&1
S=(--job "$src/configs/tiny-code.toml" --set "model.config=\"$src/configs/models/tiny-code.json\""
   --set "data.train=\"$T/data/train\"" --set "data.eval.code=\"$T/data/heldout\""
   --set schedule.steps=8 --set checkpoint.every=4 --set checkpoint.keep=4)

# "step loss" per optimizer step, then "eval loss", from a run's metrics.jsonl.
losses() {
  sed -n 's/.*"grad_norm".*"loss":\([^,]*\),.*"step":\([0-9]*\).*/\2 \1/p' "$1/metrics.jsonl"
  sed -n 's/.*"eval".*"loss":\([^,]*\),.*/eval \1/p' "$1/metrics.jsonl" | tail -1
}
# Every line of $2 must match the same step of $1 to relative $tol.
same() {
  awk -v tol="$tol" -v what="$3" 'NR == FNR { want[$1] = $2; next }
    { d = $2 - want[$1]; if (d < 0) d = -d; r = d / (want[$1] < 0 ? -want[$1] : want[$1]);
      if (r > worst) worst = r; if (!($1 in want) || r > tol) bad = bad " " $1; n++ }
    END { printf "%s: %d values, worst rel err %.3g\n", what, n, worst;
          if (bad != "" || n == 0) { print "MISMATCH at" bad; exit 1 } }' \
    <(losses "$1") <(losses "$2")
}

"$bin" train "${S[@]}" --set "run.dir=\"$T/one\"" >"$T/one.log"
"${mpirun[@]}" -np 4 "$bin" train "${S[@]}" --set "run.dir=\"$T/four\"" --set parallel.ep=4 \
  >"$T/four.log"
cat "$T/four.log"
[ "$(grep -c '^mesh: world 4 = 1 replica(s) x EP 4' "$T/four.log")" = 1 ] || { echo "banner not once"; exit 1; }
grep -q '"rows_received_per_rank":\[[0-9]*,[0-9]*,[0-9]*,[0-9]*\]' "$T/four/metrics.jsonl" ||
  { echo "no per-rank communication metrics"; exit 1; }
same "$T/one" "$T/four" "4 ranks EP 4 vs one process"

ck=$T/four/checkpoints/step_00000004
[ -f "$ck/index.json" ] && [ -f "$ck/shard-00003-of-00004.safetensors" ] || { echo "no sharded checkpoint"; exit 1; }
"${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/two\"" --set parallel.ep=2 \
  --resume-from "$ck" >"$T/two.log"
same "$T/four" "$T/two" "resumed on 2 ranks EP 2 vs uninterrupted 4 ranks"
"$bin" train "${S[@]}" --set "run.dir=\"$T/one_r\"" --resume-from "$ck" >"$T/one_r.log"
same "$T/four" "$T/one_r" "resumed on one process vs uninterrupted 4 ranks"
same "$T/one" "$T/one_r" "resumed on one process vs uninterrupted one process"
"${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/two_p\"" --set parallel.ep=2 \
  --resume-from "$T/one/checkpoints/step_00000004" >"$T/two_p.log"
same "$T/one" "$T/two_p" "one-process checkpoint resumed on 2 ranks vs one process"
echo PASS
