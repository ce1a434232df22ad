#!/usr/bin/env bash
# `moetrain train --plan auto` end to end on a small prepared dataset:
#   one process, ample memory (the job key parallel.plan): the plan is printed, the job's
#     micro-batch is kept and the losses equal the same job run with its manual keys;
#   two ranks (--plan auto --mem-gb between the EP 1 and EP 2 needs): the planner chooses EP 2,
#     the mesh banner says so, and the losses equal the one-process run;
#   a limit no plan meets: non-zero exit with the planner's explanation, no training.
# Usage: plan_auto_check.sh MOETRAIN MPIRUN... (the mpirun command with its flags)
set -euo pipefail
bin=$1; shift
mpirun=("$@")
src=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
tol=1e-5

"$bin" data prepare "$src/src" --ext .h --max-bytes 150000 --vocab 384 --seq 64 --out "$T/data" >/dev/null 2>&1
S=(--job "$src/configs/tiny-code.toml" --set "model.config=\"$src/configs/models/tiny-code.json\""
   --set "data.train=\"$T/data/train\"" --set "data.eval.code=\"$T/data/heldout\""
   --set schedule.steps=4 --set checkpoint.every=0)

losses() {
  sed -n 's/.*"grad_norm".*"loss":\([^,]*\),.*"step":\([0-9]*\).*/\2 \1/p' "$1/metrics.jsonl"
  sed -n 's/.*"eval".*"loss":\([^,]*\),.*/eval \1/p' "$1/metrics.jsonl" | tail -1
}
same() {
  awk -v tol="$tol" -v what="$3" 'NR == FNR { want[$1] = $2; next }
    { d = $2 - want[$1]; if (d < 0) d = -d; r = d / (want[$1] < 0 ? -want[$1] : want[$1]);
      if (r > worst) worst = r; if (!($1 in want) || r > tol) bad = bad " " $1; n++ }
    END { printf "%s: %d values, worst rel err %.3g\n", what, n, worst;
          if (bad != "" || n == 0) { print "MISMATCH at" bad; exit 1 } }' \
    <(losses "$1") <(losses "$2")
}
fail() { echo "FAIL: $*"; exit 1; }

"$bin" train "${S[@]}" --set "run.dir=\"$T/manual\"" >"$T/manual.log"
"$bin" train "${S[@]}" --set "run.dir=\"$T/auto1\"" --set parallel.plan=auto --set parallel.mem_gb=8 \
  >"$T/auto1.log"
cat "$T/auto1.log"
grep -q '^plan auto (engine zero1+ep, world 1, limit 8.00 GB per rank from parallel.mem_gb' "$T/auto1.log" ||
  fail "no plan printed"
grep -q 'chosen: ep 1, a2a_chunks 1, shard_experts off, 4 sequence(s) x 64 tokens per rank' "$T/auto1.log" ||
  fail "one process: not the job's micro-batch"
grep -q 'plan = "manual"' "$T/auto1/job.toml" || fail "resolved job does not record the plan"
same "$T/manual" "$T/auto1" "plan auto on one process vs the manual job"

# The per-rank limit between the EP 1 and EP 2 predictions, from the plan printed with room.
"${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/probe\"" --set schedule.steps=1 \
  --plan auto --mem-gb 8 >"$T/probe.log"
need1=$(sed -n 's/.*chosen: ep 1,.*//; s/^  predicted per rank: .* = \([0-9.]*\) MB$/\1/p' "$T/probe.log" | head -1)
need2=$(sed -n 's/^  why not ep 2: best such plan .*//p' "$T/probe.log" | head -1)
[ -n "$need1" ] || { cat "$T/probe.log"; fail "no prediction in the plan"; }
mem=$(awk -v m="$need1" 'BEGIN { printf "%.9f", m * 0.97 / 1000 }')
"${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/auto2\"" --plan auto --mem-gb "$mem" \
  >"$T/auto2.log"
cat "$T/auto2.log"
grep -q 'chosen: ep 2,' "$T/auto2.log" || fail "2 ranks at $mem GB: EP 2 not chosen"
grep -q 'why not ep 1: never fits' "$T/auto2.log" || fail "no reason given against EP 1"
[ "$(grep -c '^mesh: world 2 = 1 replica(s) x EP 2' "$T/auto2.log")" = 1 ] || fail "mesh banner not EP 2 once"
same "$T/manual" "$T/auto2" "plan auto on 2 ranks (EP 2) vs one process"

if out=$(timeout 60 "${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/bad\"" \
  --plan auto --mem-gb 0.0001 2>&1); then fail "0.1 MB per rank did not fail"; fi
grep -q 'no parallel plan fits 100.0 kB per rank' <<<"$out" || { echo "$out"; fail "no planner explanation"; }
grep -q 'over memory, largest part' <<<"$out" || { echo "$out"; fail "no rejection reasons"; }
[ ! -f "$T/bad/metrics.jsonl" ] || fail "trained despite the error"
echo PASS
