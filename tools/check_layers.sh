#!/usr/bin/env bash
# Fails on any include that points up the layer order (docs/architecture.md), lowest first:
#   core < ops < model < io = decode < parallel < plan < train < cli
# A file under src/<layer>/ may include its own layer and the layers below it; io and decode
# share a rank and include neither each other nor anything above model.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A rank=([core]=0 [ops]=1 [model]=2 [io]=3 [decode]=3 [parallel]=4 [plan]=5 [train]=6 [cli]=7)
bad=0
while IFS= read -r -d '' f; do
  from=${f#src/}
  from=${from%%/*}
  [ -n "${rank[$from]+x}" ] || { echo "check_layers: $f is in no known layer ($from)"; bad=1; continue; }
  while IFS=: read -r line inc; do
    to=${inc%%/*}
    [ -n "${rank[$to]+x}" ] || continue  # generated headers, third-party
    if [ "$to" != "$from" ] && [ "${rank[$to]}" -ge "${rank[$from]}" ]; then
      echo "check_layers: $f:$line includes $inc ($from may not include $to)"
      bad=1
    fi
  done < <(grep -noE '^#include "[a-z_]+/[^"]*"' "$f" | sed -E 's/^([0-9]+):#include "(.*)"/\1:\2/')
done < <(find src -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
if [ "$bad" -ne 0 ]; then
  echo "check_layers: upward includes found (layer order in tools/check_layers.sh)" >&2
  exit 1
fi
echo "check_layers: no upward include"
