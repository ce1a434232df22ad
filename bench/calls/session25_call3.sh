#!/usr/bin/env bash
# Session 25, call 3 (optional, after session24_call1/2): `moetrain tune` on the GPU, built without
# a device in session 25. The demo's code corpus prepared on the device, then the `small` preset's
# pretraining job under bf16 tuned over the routed experts' grouped GEMM configuration (job key
# kernels.grouped_gemm) and train.recompute: each trial 1 + 3 real steps, the job's own settings
# first. Shows the tuner's loop on the device; the small model's experts are far below issue 14's
# shapes, so its kernel ranking says nothing about those.
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
  --space 'kernels.grouped_gemm=coop128x256c2x1,coop128x256c2x1:down=coop128x256c2x1,pingpong128x128c2x1;train.recompute=none,full' \
  --trials 6 --steps 3 --out "$L/tune.json" > "$L/tune.txt" 2>&1
echo "rc=$?"; tail -9 "$L/tune.txt"; pack
el done
