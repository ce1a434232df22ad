#!/usr/bin/env bash
# Session 26, call 3 (optional, after session24_call1.sh and session26_call2.sh): `moetrain tune`
# on the GPU with `--space auto` (on a GPU with routed experts and KDA layers: train.recompute x
# kernels.grouped_gemm x kernels.kda, tune.h's auto_tune_space). The demo's code corpus prepared on
# the device from the Python standard library, then the `small` preset's pretraining job under
# bf16, each trial 1 + 3 real steps, the job's own settings first. Shows the tuner's loop on the
# device; the small model is far below issue 14's shapes, so its ranking says nothing about those.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
budget=300
unpack
el prepare
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
timeout 90 $D/bin/moetrain data prepare "$stdlib" --ext .py --max-bytes 2000000 --vocab 2048 \
  --out /tmp/tdata > "$L/prepare.txt" 2>&1; echo "rc=$?"; tail -1 "$L/prepare.txt"
el tune
timeout $(( $(left) - 20 )) $D/bin/moetrain tune --job configs/pretrain-code.toml --device cuda \
  --set 'data.train="/tmp/tdata/train"' --set 'data.eval={}' --set model.precision=bf16 \
  --space auto --trials 8 --steps 3 --out "$L/tune.json" > "$L/tune.txt" 2>&1
echo "rc=$?"; tail -9 "$L/tune.txt"; pack
el done
