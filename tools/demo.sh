#!/usr/bin/env bash
# Installs what is missing, builds moetrain and runs `moetrain demo` on its embedded defaults.
# Extra arguments go to the demo (e.g. tools/demo.sh --steps 20).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh build --target moetrain_cli >/dev/null
exec build/moetrain demo "$@"
