#!/usr/bin/env bash
# A sharded checkpoint loaded at another world size holds, at load, exactly the state that was
# saved: mpi_reshard_check loads the step-4 checkpoint of a 4-rank run (EP 4) on 2 ranks with
# FSDP, on 2 ranks EP 1 and on 1 rank, saves it again at once and compares every weight, moment
# and counter with the original bit for bit; likewise a one-process checkpoint loaded on 2 ranks
# (EP 2). A checkpoint of another step must differ (the comparison can fail).
# Usage: reshard_check.sh MOETRAIN MPI_RESHARD_CHECK MPIRUN...
set -euo pipefail
bin=$1 check=$2; shift 2
mpirun=("$@")
source "$(dirname "$0")/cli_setup.sh"

S+=(--set schedule.steps=4 --set checkpoint.every=2 --set checkpoint.keep=4
     --set log.progress=\"off\")
"${mpirun[@]}" -np 4 "$bin" train "${S[@]}" --set "run.dir=\"$T/four\"" --set parallel.ep=4 >"$T/four.log"
"$bin" train "${S[@]}" --set "run.dir=\"$T/one\"" >"$T/one.log"
ck=$T/four/checkpoints/step_00000004
[ -f "$ck/index.json" ] || { echo "no sharded checkpoint"; exit 1; }

reshard() {  # CHECKPOINT NAME NP KEY=VALUE...
  local from=$1 name=$2 np=$3; shift 3
  local out
  out=$("${mpirun[@]}" -np "$np" "$check" save "$from" "$T/$name" "$@")
  echo "$name: $np rank(s) $*"
  "$check" compare "$from" "$out"
}
reshard "$ck" two_fsdp 2 parallel.ep=2 parallel.fsdp=true
reshard "$ck" two_ep1 2 parallel.ep=1
reshard "$ck" one_rank 1 parallel.ep=1
reshard "$T/one/checkpoints/step_00000004" one_to_two 2 parallel.ep=2
if "$check" compare "$ck" "$T/four/checkpoints/step_00000002" >/dev/null 2>&1; then
  echo "checkpoints of steps 2 and 4 compare equal: the comparison cannot fail"
  exit 1
fi
echo "reshard check passed"
