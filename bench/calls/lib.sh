# Shared by the device-call scripts (session 10 on), sourced from the repository root: logs under
# $L, tarred into $OUT/logs.tgz by `pack` after each stage (the device returns only a few files);
# `el` stamps a stage with the seconds since the start; `unpack` puts the packed binaries in $D.
OUT=${OUT:-/tmp/gpu_out}; L=${L:-/tmp/logs}; mkdir -p "$OUT" "$L"
D=/tmp/moetrain-gpu
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
pack() { tar -C "$L" -czf "$OUT/logs.tgz" .; }
unpack() {
  mkdir -p "$D" && tar -C "$D" -xzf .gpu/pack.tgz
  export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
}
