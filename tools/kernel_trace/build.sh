#!/usr/bin/env bash
# Builds the kernel tracer (kernel_trace.c) into $1 (default .gpu/trace), with the CUPTI library it
# loads beside it: the device image's CUPTI may sit elsewhere or be missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../.gpu/trace}
mkdir -p "$out" && out=$(cd "$out" && pwd)  # absolute: the build runs from $here
cd "$here"
cuda=${CUDA_HOME:-/usr/local/cuda}
cupti=$(find "$cuda"/ "$cuda"/extras/CUPTI -maxdepth 3 -name 'libcupti.so.*' 2>/dev/null | head -1 || true)
[ -n "$cupti" ] || { echo "kernel_trace: no libcupti.so under $cuda" >&2; exit 1; }
gcc -O2 -Wall -Wextra -Werror -shared -fPIC kernel_trace.c -I"$cuda/include" \
  -I"$cuda/extras/CUPTI/include" -L"$(dirname "$cupti")" -lcupti -o "$out/libkernel_trace.so"
cp -L "$cupti" "$out/"
cp summarize.py "$out/"
echo "kernel_trace: $out/libkernel_trace.so (with $(basename "$cupti"))"
