#!/usr/bin/env bash
# A peer that stops answering (SIGSTOP: alive, holding its connections, never progressing) in
# the middle of the expert exchange: the other rank's bounded wait must report its rank, the
# collective and its sizes and name the stopped peer, and the job must end within 60 s with
# the stopped process gone too. Rank 1 stops at its 5th all-to-all-v (2 chunks: the counts, two
# dispatches, then the second return of the first MoE layer), with a 3 s bound on every wait.
# Usage: stopped_peer_check.sh MPI_TRAIN_CHECK MPIRUN... (the mpirun command with its flags)
set -uo pipefail
bin=$1; shift
t0=$SECONDS
out=$(timeout 90 "$@" -np 2 -x MOETRAIN_FAULT_KILL_RANK=1 -x MOETRAIN_FAULT_KILL_IN=all_to_all_v \
  -x MOETRAIN_FAULT_KILL_CALL=5 -x MOETRAIN_FAULT_SIGNAL=STOP \
  "$bin" --ep 2 --chunks 2 --steps 3 --timeout-ms 3000 2>&1)
rc=$?
took=$((SECONDS - t0))
echo "$out"
[ "$rc" != 124 ] || { echo "FAIL: no exit within 90 s"; exit 1; }
[ "$took" -le 60 ] || { echo "FAIL: took ${took}s (limit 60)"; exit 1; }
pattern='rank 0 failed: CommError: ep group rank 0/2 \(world rank 0\): all_to_all_v \(sending [0-9]+ B, receiving [0-9]+ B\) did not complete within 3000 ms; .*stopped: world rank 1 \(pid ([0-9]+)\)'
[[ $out =~ $pattern ]] || { echo "FAIL: no report naming the collective, its sizes and the stopped rank 1"; exit 1; }
pid=${BASH_REMATCH[1]}
# The stopped process must not outlive the job (a zombie awaiting its parent is gone already).
for _ in 1 2 3 4 5; do
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)
  [ -z "$state" ] || [ "$state" = Z ] && break
  sleep 1
done
[ -z "$state" ] || [ "$state" = Z ] || { echo "FAIL: the stopped rank (pid $pid, state $state) was left behind"; kill -9 "$pid"; exit 1; }
echo "stopped peer: reported by rank 0 and the job ended in ${took}s, nothing left"
