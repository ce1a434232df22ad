#!/usr/bin/env bash
# How much communication the distributed step hides, at world 1 on one GPU (docs/parallelism.md,
# "Measuring overlap"): `mpirun -np 1 moetrain train --device cuda` on tests/cuda/gpu_mesh_tiny.toml
# (FSDP units, the experts through the exchange at EP 1 in 2 chunks, deterministic) with a
# simulated peer delay of 0 and $DELAY us before every collective (a spin kernel on its stream,
# MOETRAIN_SIM_COMM_US), each with the collectives on their own streams (overlap) and on the
# compute stream (MOETRAIN_COMM_OVERLAP=0). Prints per run the median, over the steps after the
# first, of the step time (elapsed time between metrics lines, so the logging's two small
# collectives are in it) and the communicator's device time per step (metrics.jsonl comm
# device_seconds_max), then the share of the added delay that the step time did not show
# (1 - added step time with overlap / added step time serialised).
# Fails unless the four runs' losses are identical. Exits 77 (skipped) without a GPU; ~30 s.
# Usage: gpu_overlap_check.sh MOETRAIN MPIRUN...   (DELAY=200 STEPS=6 by default)
set -euo pipefail
bin=$1; shift
mpirun=("$@")
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU visible: skipped"; exit 77; }
source "$(dirname "$0")/../parallel/cli_setup.sh"
source "$(dirname "$0")/../parallel/cli_losses.sh"
delay=${DELAY:-200}
steps=${STEPS:-6}
tokens=256  # train.batch 4 x seq 64 (the prepared data)
G=(--job "$src/tests/cuda/gpu_mesh_tiny.toml" --device cuda
   --set "model.config=\"$src/configs/models/tiny-code.json\""
   --set "data.train=\"$T/data/train\"" --set "data.eval.code=\"$T/data/heldout\""
   --set "run.seed=$run_seed" --set "schedule.steps=$steps" --set "checkpoint.every=1000"
   --set "parallel.a2a_chunks=2")

run() {  # NAME DELAY_US OVERLAP
  MOETRAIN_EXCHANGE_AT_EP1=1 MOETRAIN_SIM_COMM_US=$2 MOETRAIN_COMM_OVERLAP=$3 \
    "${mpirun[@]}" -np 1 "$bin" train "${G[@]}" --set "run.dir=\"$T/$1\"" >"$T/$1.log" 2>&1 ||
    { cat "$T/$1.log"; exit 1; }
}
# Median over the steps after the first: step ms (the difference of the run's elapsed time,
# tokens done / tokens_per_s, between consecutive steps) and comm device ms.
median() { sort -g | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : "nan" }'; }
stats() {
  sed -n 's/.*"device_seconds_max":\([^,}]*\).*"step":\([0-9]*\),.*"tokens_per_s":\([^,}]*\).*/\2 \1 \3/p' \
    "$T/$1/metrics.jsonl" | awk -v tok="$tokens" '
      { t = $1 * tok / $3 }
      $1 > 1 { printf "%.3f %.3f\n", 1e3 * (t - prev), 1e3 * $2 }
      { prev = t }' >"$T/$1.steps"
  echo "$(cut -d' ' -f1 "$T/$1.steps" | median) $(cut -d' ' -f2 "$T/$1.steps" | median)"
}

run base 0 1
run serial 0 0
run delay "$delay" 1
run delay_serial "$delay" 0
printf '%-14s %9s %8s %10s %14s\n' run delay_us overlap step_ms comm_device_ms
declare -A step
for r in base serial delay delay_serial; do
  read -r s c <<<"$(stats $r)"
  step[$r]=$s
  case $r in base) d=0 o=on ;; serial) d=0 o=off ;; delay) d=$delay o=on ;; *) d=$delay o=off ;; esac
  printf '%-14s %9s %8s %10s %14s\n' "$r" "$d" "$o" "$s" "$c"
done
awk -v a="${step[base]}" -v b="${step[delay]}" -v c="${step[serial]}" -v d="${step[delay_serial]}" \
  'BEGIN { added_o = b - a; added_s = d - c;
           printf "added step time by the delay: %.3f ms overlapped, %.3f ms serialised", added_o, added_s;
           if (added_s > 0) printf "; hidden %.0f%%", 100 * (1 - added_o / added_s); print "" }'
tol=0
same "$T/base" "$T/serial" "serialised vs overlapped"
same "$T/base" "$T/delay" "delayed vs not"
same "$T/base" "$T/delay_serial" "delayed and serialised vs neither"
echo "ok"
