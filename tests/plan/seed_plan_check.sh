#!/usr/bin/env bash
# The planner's plan for seed-2.8t on 128 devices of 80 GB is one the engine runs as it is:
#   `moetrain plan` gives plan 1 as job keys and says the engine supports it;
#   a dry run under mpirun (mesh, model, shards; no step) takes those keys unchanged except for
#   the scale: configs/models/seed-mini.json (the seed's layer pattern and proportions, 28 of
#   its 896 experts) on 8 ranks with the plan's number of expert replicas, so EP = 8 / replicas;
#   every rank reports FSDP shards holding its share of the experts and the plan's recompute.
#   Like the plan: LoRA rank 16 on every projection, routed experts frozen without adapters.
# Usage: seed_plan_check.sh MOETRAIN MPIRUN... (the mpirun command with its flags)
set -euo pipefail
bin=$1; shift
mpirun=("$@")
source "$(dirname "$0")/../parallel/cli_setup.sh"
fail() { echo "FAIL: $*"; exit 1; }

j=$("$bin" plan --model seed-2.8t --gpus 128 --mem-gb 80 --top 1 --json)
job=$(jq -c .job <<<"$j")
echo "plan 1 as job keys: $job"
[ "$(jq -r .unsupported <<<"$job")" = "" ] || fail "the engine cannot run plan 1: $(jq -r .unsupported <<<"$job")"
ep=$(jq -r .ep <<<"$job")
replicas=$((128 / ep))
world=8
[ $((world % replicas)) = 0 ] || fail "$replicas replicas do not fit $world ranks"
small_ep=$((world / replicas))
mbs=$(($(jq -r .batch <<<"$job") / 128))
# The plan's keys, ep and batch scaled to the small world.
set_args=$(jq -r .set <<<"$job" | sed -e "s/parallel.ep=$ep/parallel.ep=$small_ep/" \
  -e "s/train.batch=$((mbs * 128))/train.batch=$((mbs * world))/")
echo "scaled to $world ranks: $set_args"
grep -q "parallel.shard_expert_weights=true" <<<"$set_args" || fail "plan 1 does not shard the expert weights"

# shellcheck disable=SC2086  # set_args is a list of --set options
"${mpirun[@]}" -np $world "$bin" train "${S[@]}" \
  --set "model.config=\"$src/configs/models/seed-mini.json\"" \
  --set 'data.eval={}' --set "run.dir=\"$T/run\"" $set_args --dry-run \
  --set 'lora.targets=["attention","kda","shared_experts","dense_ffn"]' --set lora.rank=16 \
  >"$T/dry.log"
cat "$T/dry.log"
grep -q "^mesh: world $world = $replicas replica(s) x EP $small_ep" "$T/dry.log" || fail "no mesh banner"
grep -q "(weights, gradients and optimizer state sharded)" "$T/dry.log" || fail "experts not sharded"
rc=$(jq -r .recompute <<<"$job")
[ "$(grep -c "^dry run rank .*of which experts [1-9][0-9]* B.*recompute $rc$" "$T/dry.log")" = $world ] ||
  fail "not every rank holds expert shards with recompute $rc"
[ ! -e "$T/run/checkpoints" ] || fail "a dry run wrote checkpoints"
echo PASS
