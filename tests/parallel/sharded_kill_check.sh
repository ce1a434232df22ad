#!/usr/bin/env bash
# SIGKILL of one writer of a sharded (mesh) checkpoint save at chosen byte offsets (docs/reliability.md,
# "Faults"): 2 ranks, EP 2 with FSDP, checkpoints at steps 2, 4, 6; the save of step 4 is killed on
# rank 0 or rank 1 at byte offsets spread over what that rank writes (its shard's length prefix,
# header and tensor data; on rank 0 also index.json, state.json, job.toml, manifest.json, `latest`)
# and at the commit's named points. mpirun then ends the job. After every kill `latest` must name a
# checkpoint whose every file equals the uninterrupted run's of that step, and `--resume` must end
# with a final checkpoint whose every file (both shards, index.json, state.json, job.toml,
# manifest.json) equals the uninterrupted run's byte for byte.
# Usage: sharded_kill_check.sh MOETRAIN MPIRUN... (the mpirun command with its flags)
# The job seed (cli_setup.sh: MOETRAIN_TEST_SEED when set, printed on failure) also picks the extra
# offsets.
set -euo pipefail
bin=$1; shift
mpirun=("$@")
source "$(dirname "$0")/cli_setup.sh"
RANDOM=$seed

A=(train "${S[@]}" --set schedule.steps=6 --set checkpoint.every=2 --set checkpoint.keep=10
   --set parallel.ep=2 --set parallel.fsdp=true --set "run.dir=\"$T/run\"")
files=(shard-00000-of-00002.safetensors shard-00001-of-00002.safetensors index.json state.json
       job.toml manifest.json)

# Every run, the reference too, uses the same run directory: job.toml names it, and the
# manifest's checksum of job.toml decides the save's length (unpadded hex).
"${mpirun[@]}" -np 2 "$bin" "${A[@]}" >"$T/ref.log" 2>&1 || { cat "$T/ref.log"; exit 1; }
mv "$T/run" "$T/ref"
ref=$T/ref/checkpoints
size() { stat -c %s "$1"; }
# A safetensors file's header length (its first 8 bytes, little-endian).
header() { od -An -t u8 -N 8 "$1" | tr -d ' '; }
same_files() {  # want_dir got_dir
  for f in "${files[@]}"; do
    cmp -s "$1/$f" "$2/$f" || { echo "FAIL: $2/$f differs from $1/$f"; return 1; }
  done
}
save_bytes() {  # what rank $1 writes in the save of $2 (train/faults.h counts it so)
  local d=$2
  if [ "$1" = 1 ]; then size "$d/shard-00001-of-00002.safetensors"; return; fi
  echo $(( $(size "$d/shard-00000-of-00002.safetensors") + $(size "$d/index.json") +
           $(size "$d/state.json") + $(size "$d/job.toml") + $(size "$d/manifest.json") +
           $(size "$ref/latest") ))
}

c4=$ref/step_00000004
s0=$(size "$c4/shard-00000-of-00002.safetensors"); h0=$(header "$c4/shard-00000-of-00002.safetensors")
s1=$(size "$c4/shard-00001-of-00002.safetensors"); h1=$(header "$c4/shard-00001-of-00002.safetensors")
ix=$(size "$c4/index.json"); stt=$(size "$c4/state.json"); jb=$(size "$c4/job.toml")
total0=$(save_bytes 0 "$c4")
# rank:offset. Rank 0: its shard's length prefix, header, first tensor byte, inside the data, its
# last byte, then every file boundary and inside index.json, state.json, job.toml, manifest.json
# and `latest`. Rank 1 (its shard only): the prefix, header, data, last byte.
kills=(0:0 0:3 0:8 0:$((8 + h0 / 2)) 0:$((8 + h0)) 0:$((8 + h0 + 1001)) 0:$(((s0 + h0) / 2))
       0:$((s0 - 1)) 0:$s0 0:$((s0 + ix / 2)) 0:$((s0 + ix)) 0:$((s0 + ix + stt / 3))
       0:$((s0 + ix + stt + jb / 2)) 0:$((s0 + ix + stt + jb + 40)) 0:$((total0 - 1))
       1:0 1:5 1:$((8 + h1 / 3)) 1:$((8 + h1)) 1:$((8 + h1 + 4097)) 1:$((s1 * 2 / 3)) 1:$((s1 - 1)))
# Two more per rank from the seed, anywhere in what that rank writes.
for r in 0 1 0 1; do
  n=$([ $r = 0 ] && echo "$total0" || echo "$s1")
  kills+=("$r:$(( ((RANDOM << 15) | RANDOM) % n ))")
done
kills+=(0:complete 0:installed 0:latest)
echo "rank 0 writes $total0 bytes, rank 1 $s1; ${#kills[@]} kills: ${kills[*]}"

for k in "${kills[@]}"; do
  r=${k%%:*}; at=${k#*:}
  if [[ $at =~ ^[0-9]+$ ]]; then fault=MOETRAIN_FAULT_KILL_AT_BYTE=$at; else fault=MOETRAIN_FAULT_KILL_AT=$at; fi
  # Only rank $r gets the fault (one app context per rank); mpirun ends the other rank.
  plain=(-np 1 "$bin" "${A[@]}")
  faulty=(-np 1 env "$fault" MOETRAIN_FAULT_KILL_SAVE_STEP=4 "$bin" "${A[@]}")
  if [ "$r" = 0 ]; then ctx=("${faulty[@]}" : "${plain[@]}"); else ctx=("${plain[@]}" : "${faulty[@]}"); fi
  rc=0; timeout 120 "${mpirun[@]}" "${ctx[@]}" >"$T/kill.log" 2>&1 || rc=$?
  grep -q "rank $r with PID [0-9]* on node .* exited on signal 9" "$T/kill.log" ||
    { cat "$T/kill.log"; echo "FAIL ($k): rank $r was not SIGKILLed (mpirun exit $rc)"; exit 1; }
  want=step_00000002; [ "$at" = latest ] && want=step_00000004
  got=$(cat "$T/run/checkpoints/latest")
  [ "$got" = "$want" ] || { echo "FAIL ($k): latest names $got, not $want"; exit 1; }
  same_files "$ref/$want" "$T/run/checkpoints/$want" || { echo "($k)"; exit 1; }
  "${mpirun[@]}" -np 2 "$bin" "${A[@]}" --resume >"$T/res.log" 2>&1 ||
    { cat "$T/res.log"; echo "FAIL ($k): resume failed"; exit 1; }
  same_files "$ref/step_00000006" "$T/run/checkpoints/step_00000006" || { echo "($k)"; exit 1; }
  # The offsets hold only while every save writes the reference's bytes.
  [ "$(save_bytes "$r" "$T/run/checkpoints/step_00000004")" = "$(save_bytes "$r" "$c4")" ] ||
    { echo "FAIL ($k): the resumed step-4 save has another length than the reference's"; exit 1; }
  rm -rf "$T/run"
done
echo "${#kills[@]} kills of one writer of the sharded save: latest complete, resume bitwise equal"
echo PASS
