#!/usr/bin/env bash
# `mpirun -np 1 moetrain train --device cuda` (the distributed trainer on one GPU over NCCL, FSDP
# units) against the one-process GPU trainer on tests/cuda/gpu_mesh_tiny.toml: the banner names
# the rank's GPU and NCCL, losses and the held-out loss agree to 1e-5 (FSDP's parameter views
# may take other kernel paths, so not bit for bit; tests/cuda/test_cuda_dist.cpp), the sharded
# checkpoint is written from device memory and resumes on one process to the same losses.
# Exits 77 (skipped) without a GPU. Usage: gpu_mesh_cli_check.sh MOETRAIN MPIRUN...
set -euo pipefail
bin=$1; shift
mpirun=("$@")
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU visible: skipped"; exit 77; }
source "$(dirname "$0")/../parallel/cli_setup.sh"
tol=1e-5
G=(--job "$src/tests/cuda/gpu_mesh_tiny.toml" --device cuda
   --set "model.config=\"$src/configs/models/tiny-code.json\""
   --set "data.train=\"$T/data/train\"" --set "data.eval.code=\"$T/data/heldout\""
   --set "run.seed=$run_seed")

source "$(dirname "$0")/../parallel/cli_losses.sh"

"$bin" train "${G[@]}" --set "run.dir=\"$T/one\"" >"$T/one.log"
"${mpirun[@]}" -np 1 "$bin" train "${G[@]}" --set "run.dir=\"$T/mesh\"" >"$T/mesh.log"
cat "$T/mesh.log"
grep -q '^mesh: world 1 = 1 replica(s) x EP 1' "$T/mesh.log" || { echo "no mesh banner"; exit 1; }
grep -q 'GPUs (NCCL, one per rank.*rank 0 -> cuda:0' "$T/mesh.log" || { echo "no GPU line"; exit 1; }
grep -q '"comm"' "$T/mesh/metrics.jsonl" || { echo "no communication metrics"; exit 1; }
same "$T/one" "$T/mesh" "mpirun -np 1 on the GPU (NCCL, FSDP) vs one process on the GPU"
ck=$T/mesh/checkpoints/step_00000004
[ -f "$ck/index.json" ] || { echo "no sharded checkpoint"; exit 1; }
"$bin" train "${G[@]}" --set "run.dir=\"$T/one_r\"" --resume-from "$ck" >"$T/one_r.log"
same "$T/mesh" "$T/one_r" "the GPU mesh's checkpoint resumed on one GPU process vs uninterrupted"
echo "ok"
