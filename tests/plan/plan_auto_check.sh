#!/usr/bin/env bash
# `moetrain train --plan auto` end to end on a small prepared dataset:
#   one process, ample memory (the job key parallel.plan): the plan is printed, the job's
#     micro-batch is kept and the losses equal the same job run with its manual keys;
#   two ranks (--plan auto): with room the job's micro-batch and the one-process losses; at 2 MB
#     per rank the micro-batch halves and grad_accum doubles (losses equal the manual job so);
#   a limit no plan meets: non-zero exit with the planner's explanation, no training.
# Usage: plan_auto_check.sh MOETRAIN MPIRUN... (the mpirun command with its flags)
set -euo pipefail
bin=$1; shift
mpirun=("$@")
source "$(dirname "$0")/../parallel/cli_setup.sh"
tol=1e-5

S+=(--set schedule.steps=4 --set checkpoint.every=0)

source "$(dirname "$0")/../parallel/cli_losses.sh"
fail() { echo "FAIL: $*"; exit 1; }

"$bin" train "${S[@]}" --set "run.dir=\"$T/manual\"" >"$T/manual.log"
"$bin" train "${S[@]}" --set "run.dir=\"$T/auto1\"" --set parallel.plan=auto --set parallel.mem_gb=8 \
  >"$T/auto1.log"
cat "$T/auto1.log"
grep -q '^plan auto (engine zero1+ep, world 1, limit 8.00 GB per rank from parallel.mem_gb' "$T/auto1.log" ||
  fail "no plan printed"
grep -q 'chosen: ep 1, a2a_chunks 1, shard_experts off, shard_expert_weights off, recompute none, 4 sequence(s) x 64 tokens per rank' "$T/auto1.log" ||
  fail "one process: not the job's micro-batch"
grep -q "plan = 'manual'" "$T/auto1/job.toml" || fail "resolved job does not record the plan"
same "$T/manual" "$T/auto1" "plan auto on one process vs the manual job"

# Two ranks with room: the job's 2 sequences per rank, expert state sharded (equal speed, less
# memory), the one-process losses.
"${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/auto2\"" --plan auto --mem-gb 8 >"$T/auto2.log"
cat "$T/auto2.log"
grep -q 'chosen: ep 1, a2a_chunks 1, shard_experts on, shard_expert_weights off, recompute none, 2 sequence(s) x 64' "$T/auto2.log" || fail "2 ranks: unexpected plan"
[ "$(grep -c '^mesh: world 2 = 2 replica(s) x EP 1' "$T/auto2.log")" = 1 ] || fail "mesh banner not once"
same "$T/manual" "$T/auto2" "plan auto on 2 ranks vs one process"
# 2.0 MB per rank: 2 sequences per rank (2.34 MB predicted) do not fit, 1 does; grad_accum doubles.
"${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/tight\"" --plan auto --mem-gb 0.002 >"$T/tight.log"
cat "$T/tight.log"
grep -q 'chosen: .* 1 sequence(s) x 64 tokens per rank per micro-batch; train.batch 2, grad_accum 2' "$T/tight.log" ||
  fail "2 ranks at 2 MB: micro-batch not halved"
grep -q "the job's 2 sequence(s) per rank do not fit; grad_accum 1 -> 2" "$T/tight.log" || fail "no reason for the smaller micro-batch"
"$bin" train "${S[@]}" --set "run.dir=\"$T/manual_accum\"" --set train.batch=2 --set train.grad_accum=2 >/dev/null
same "$T/manual_accum" "$T/tight" "plan auto on 2 ranks at 2 MB vs one process, batch 2 x grad_accum 2"

# 1.0 MB per rank on 3 ranks (8 experts: EP 1, so 3 expert replicas): no zero1+ep plan and no
# plan without recompute fits; the experts' weights are sharded over the 3 replicas (ZeRO-3,
# fsdp+ep) and each layer recomputed, at one sequence per rank. The resolved job records it and
# the losses equal one process on the same 6 sequences per step.
"${mpirun[@]}" -np 3 "$bin" train "${S[@]}" --set "run.dir=\"$T/zero3\"" --set train.batch=6 \
  --plan auto --mem-gb 0.001 >"$T/zero3.log"
cat "$T/zero3.log"
grep -q 'chosen: ep 1, a2a_chunks 1, shard_experts on, shard_expert_weights on, recompute full, 1 sequence(s) x 64 tokens per rank per micro-batch; train.batch 3, grad_accum 2' "$T/zero3.log" ||
  fail "3 ranks at 1 MB: not ZeRO-3 experts with recompute"
grep -q '(weights, gradients and optimizer state sharded)' "$T/zero3.log" || fail "mesh does not shard the expert weights"
for k in "shard_expert_weights = true" "fsdp = true" "recompute = 'full'"; do
  grep -q "^$k" "$T/zero3/job.toml" || fail "resolved job lacks $k"
done
"$bin" train "${S[@]}" --set "run.dir=\"$T/manual_z3\"" --set train.batch=3 --set train.grad_accum=2 >/dev/null
same "$T/manual_z3" "$T/zero3" "plan auto on 3 ranks at 1 MB (ZeRO-3 experts, recompute) vs one process"

if out=$(timeout 60 "${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/bad\"" \
  --plan auto --mem-gb 0.0001 2>&1); then fail "0.1 MB per rank did not fail"; fi
grep -q 'no parallel plan fits 100.0 kB per rank' <<<"$out" || { echo "$out"; fail "no planner explanation"; }
grep -q 'over memory, largest part' <<<"$out" || { echo "$out"; fail "no rejection reasons"; }
[ ! -f "$T/bad/metrics.jsonl" ] || fail "trained despite the error"
echo PASS
