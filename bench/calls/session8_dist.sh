#!/usr/bin/env bash
# ep8's CLI check on the device: mpirun -np 1 train --device cuda (NCCL, FSDP) vs one GPU process.
set -u
D=/tmp/moetrain-gpu; export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bash tests/cuda/gpu_mesh_cli_check.sh $D/bin/moetrain mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH
