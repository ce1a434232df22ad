#!/usr/bin/env bash
# Installs what is missing, builds moetrain and runs `moetrain demo` on its embedded defaults.
# Extra arguments go to the demo (e.g. tools/demo.sh --steps 20).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh build --target moetrain_cli >/dev/null
# On a shared 2-core machine spinning threads starve each other: idle OpenMP workers must sleep,
# and BLAS runs single-threaded (its calls are already outside the OpenMP regions, and its own
# pool would compete with them). Measured 3-5x faster per layer (bench/RESULTS.md).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec build/moetrain demo "$@"
