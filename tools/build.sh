#!/usr/bin/env bash
# Configure (once) and build under a lock, so that parallel sessions on a 2-core machine never
# run two builds at once. Usage: tools/build.sh [build-dir] [extra cmake --build args...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
exec 9>/tmp/moetrain-build.lock
flock 9
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${MOETRAIN_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$dir" -j2 "$@"
