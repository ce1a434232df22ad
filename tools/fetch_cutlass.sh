#!/usr/bin/env bash
# Unpacks CUTLASS's headers from the pinned nvidia-cutlass wheel (PyPI) into .deps/: the CUDA
# build's Hopper grouped GEMM (src/ops/cuda/cutlass/) includes them. Skips when present; checks
# the wheel's hash; unpacks under a temporary name and renames, so a broken download leaves nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.2.0.0
sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
dest=.deps/cutlass-$version
[ -f "$dest/include/cutlass/cutlass.h" ] && exit 0
mkdir -p .deps
tmp=$(mktemp -d .deps/cutlass.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_cutlass: downloading nvidia-cutlass==$version"
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==$version"
wheel=$(ls "$tmp"/nvidia_cutlass-"$version"-*.whl)
echo "$sha256  $wheel" | sha256sum --check --quiet
python3 - "$wheel" "$tmp/out" <<'PY'
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = f"{sys.argv[2]}/include/{name[len(prefix):]}"
            import os
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(z.read(name))
PY
rm -rf "$dest" && mv "$tmp/out" "$dest"
echo "fetch_cutlass: headers in $dest/include"
