#!/usr/bin/env bash
# The whole test suite from a fresh checkout: install packages, check formatting, build with
# warnings as errors, run every test. Usage: tools/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/check_format.sh
MOETRAIN_CMAKE_ARGS="-DMOETRAIN_WERROR=ON" tools/build.sh build-ci
cd build-ci
ctest --output-on-failure --timeout 900 -j2 "$@"
