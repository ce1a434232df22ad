#!/usr/bin/env bash
# The whole test suite from a fresh checkout: install packages, check formatting, build with
# warnings as errors, run every test, build and run them again under ASan + UBSan, then compile
# the CUDA build (nvcc, no GPU needed) and run its GPU checks, which skip visibly where no GPU is
# visible. Prints the time of each stage.
# Usage: tools/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
stage_start=$SECONDS
stage() {
  echo "== $1 ($((SECONDS - stage_start)) s since start)"
}
stage "setup"
tools/setup.sh
stage "format"
tools/check_format.sh
stage "layers"
tools/check_layers.sh
stage "build (CPU)"
MOETRAIN_CMAKE_ARGS="-DMOETRAIN_WERROR=ON" tools/build.sh build-ci
stage "tests (CPU)"
(cd build-ci && ctest --output-on-failure --timeout 900 -j2 "$@")
# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer (docs/reliability.md,
# "Sanitizers"; what it leaves out and why: tools/sanitize.sh).
stage "build and tests (CPU, ASan + UBSan)"
tools/sanitize.sh build-ci-asan "$@"
if command -v nvcc >/dev/null 2>&1; then
  stage "build (CUDA, sm_90a)"
  MOETRAIN_CMAKE_ARGS="-DMOETRAIN_WERROR=ON -DMOETRAIN_CUDA=ON -DMOETRAIN_BENCH=OFF" \
    tools/build.sh build-ci-cuda
  stage "GPU checks (skip without a GPU)"
  (cd build-ci-cuda && ctest --output-on-failure --timeout 900 -R 'Cuda' -j2)
else
  echo "== CUDA build skipped: nvcc not found (the CI image has it; install the CUDA toolkit)"
fi
stage "done"
