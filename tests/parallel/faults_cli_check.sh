#!/usr/bin/env bash
# Faults of `moetrain train` under mpirun (docs/reliability.md, "Faults"):
#   a rank SIGKILLed inside an all-to-all (EP 4) and inside an FSDP all-gather, under
#   `mpirun --enable-recovery` (survivors keep running): the survivors' watchdog names the
#   collective and the dead rank, the job ends within 60 s and no process is left;
#   a NaN gradient on rank 1 only: every rank skips the step (its checkpoint equals the previous
#   one bitwise), or every rank stops (train.nonfinite = "stop");
#   stop + resume on 2 ranks equals the uninterrupted 2-rank run bitwise (every shard file and
#   state.json of the final checkpoint).
# Usage: faults_cli_check.sh MOETRAIN MPIRUN... (the mpirun command with its flags)
set -euo pipefail
bin=$1; shift
mpirun=("$@")
source "$(dirname "$0")/cli_setup.sh"

S+=(--set schedule.steps=6 --set checkpoint.keep=10)

# A rank killed inside collective $1 (its $2-th call) on $3 ranks with the extra keys after.
dead_rank() {
  local coll=$1 call=$2 np=$3; shift 3
  local run="$T/dead_$coll" t0=$SECONDS rc=0 out
  out=$(timeout 90 "${mpirun[@]}" --enable-recovery -np "$np" \
    -x MOETRAIN_FAULT_KILL_RANK=1 -x MOETRAIN_FAULT_KILL_IN="$coll" -x MOETRAIN_FAULT_KILL_CALL="$call" \
    "$bin" train "${S[@]}" --set "run.dir=\"$run\"" --set parallel.comm_timeout_s=5 "$@" 2>&1) || rc=$?
  local took=$((SECONDS - t0))
  echo "$out" | grep -E "failed|dead" || true
  # mpirun --enable-recovery (Open MPI 4.1) may exit 0 after its ranks called MPI_Abort: the
  # survivors' messages are the evidence.
  [ "$rc" != 124 ] || { echo "$out"; echo "FAIL: no exit within 90 s"; exit 1; }
  [ "$took" -le 60 ] || { echo "FAIL: took ${took}s (limit 60)"; exit 1; }
  grep -qE "rank [023] failed: CommError: .*$coll .*did not complete within 5000 ms.*dead: world rank 1 \(pid [0-9]+\)" <<<"$out" ||
    { echo "$out"; echo "FAIL: no survivor named $coll and the dead rank 1"; exit 1; }
  sleep 1
  if pgrep -f "$run" >/dev/null; then pgrep -af "$run"; echo "FAIL: processes left behind"; exit 1; fi
  echo "dead rank in $coll: survivors reported it and the job ended in ${took}s, nothing left"
}
dead_rank all_to_all_v 5 4 --set parallel.ep=4
dead_rank all_gather 5 2 --set parallel.ep=1 --set parallel.fsdp=true

# A NaN gradient on rank 1 at step 3; checkpoints every step.
N=(-x MOETRAIN_FAULT_NAN=grad -x MOETRAIN_FAULT_NAN_STEP=3 -x MOETRAIN_FAULT_NAN_RANK=1)
"${mpirun[@]}" -np 2 "${N[@]}" "$bin" train "${S[@]}" --set "run.dir=\"$T/skip\"" --set parallel.ep=2 \
  --set checkpoint.every=1 --set train.nonfinite=skip >"$T/skip.log" 2>&1 || { cat "$T/skip.log"; exit 1; }
grep -q '"nonfinite".*"skipped_steps":1,"step":3' "$T/skip/metrics.jsonl" ||
  { cat "$T/skip/metrics.jsonl"; echo "FAIL: no skip at step 3 in the metrics"; exit 1; }
for f in shard-00000-of-00002.safetensors shard-00001-of-00002.safetensors; do
  cmp "$T/skip/checkpoints/step_00000002/$f" "$T/skip/checkpoints/step_00000003/$f" ||
    { echo "FAIL: the skipped step changed $f"; exit 1; }
done
if "${mpirun[@]}" -np 2 "${N[@]}" "$bin" train "${S[@]}" --set "run.dir=\"$T/stop\"" --set parallel.ep=2 \
  --set checkpoint.every=1 >"$T/stop.log" 2>&1; then echo "FAIL: nonfinite = stop did not stop"; exit 1; fi
grep -q 'step 3: non-finite.*train.nonfinite = "stop"' "$T/stop.log" || { cat "$T/stop.log"; exit 1; }
[ "$(cat "$T/stop/checkpoints/latest")" = step_00000002 ] || { echo "FAIL: latest moved"; exit 1; }
echo "NaN gradient on rank 1: all ranks skipped step 3 (checkpoint unchanged), or all stopped"

# Stop after step 3, resume on 2 ranks elsewhere: the final checkpoint equals bitwise.
"${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/full\"" --set parallel.ep=2 \
  --set checkpoint.every=3 >"$T/full.log" 2>&1
"${mpirun[@]}" -np 2 "$bin" train "${S[@]}" --set "run.dir=\"$T/res\"" --set parallel.ep=2 \
  --set checkpoint.every=3 --resume-from "$T/full/checkpoints/step_00000003" >"$T/res.log" 2>&1
for f in shard-00000-of-00002.safetensors shard-00001-of-00002.safetensors state.json index.json; do
  cmp "$T/full/checkpoints/step_00000006/$f" "$T/res/checkpoints/step_00000006/$f" ||
    { echo "FAIL: resumed $f differs"; exit 1; }
done
echo "stop + resume on 2 ranks: final shards and state.json bitwise equal"
echo PASS
