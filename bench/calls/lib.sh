# Shared by the device-call scripts (session 10 on), sourced from the repository root: logs under
# $L, tarred into $OUT/logs.tgz by `pack` after each stage (the device returns only a few files);
# `el` stamps a stage with the seconds since the start; `unpack` puts the packed binaries in $D.
OUT=${OUT:-/tmp/gpu_out}; L=${L:-/tmp/logs}; mkdir -p "$OUT" "$L"
D=/tmp/moetrain-gpu
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
pack() { tar -C "$L" -czf "$OUT/logs.tgz" .; }
unpack() {
  # Python's lzma where the image lacks xz.
  mkdir -p "$D" && { tar -C "$D" -xJf .gpu/pack.tar.xz 2>/dev/null ||
    python3 -c "import tarfile, sys; tarfile.open('.gpu/pack.tar.xz').extractall(sys.argv[1])" "$D"; }
  export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
}
# One line of a `bench step` JSON: time, throughput, memory against the plan, and the units.
step_line() { python3 -c "
import json; j=json.load(open('$1')); m=j.get('memory_check',{})
print('ms/step', round(j['ms_per_step'],1), 'tok/s', round(j['tokens_per_s']), 'measured', round(m.get('measured_gib',0),2), 'planned', round(m.get('planned_gib',0),2), 'fell', j.get('loss_fell'))
print([(u['layer'], round(u['fwd_ms'],1), round(u['bwd_ms'],1)) for u in j['profile']['units']])" 2>&1 | tail -2; }
# fla's Triton autotuning results across device calls (bench/kda_fla.py --autotune-cache): restore
# the *.autotune.json files a previous call sent back (.gpu/fla_autotune.tgz, copied there by
# tools/gpu.sh pack from FLA_AUTOTUNE), and send this call's back (a few KB), even when fla ran
# out of time: the kernels it finished stay tuned.
FLA_CACHE=/tmp/fla_triton_cache
fla_cache_restore() {
  mkdir -p "$FLA_CACHE"
  if [ -f .gpu/fla_autotune.tgz ]; then tar -C "$FLA_CACHE" -xzf .gpu/fla_autotune.tgz; fi
  echo "fla autotune cache: $(find "$FLA_CACHE" -name '*.autotune.json' | wc -l) kernels restored"
}
fla_cache_save() {
  (cd "$FLA_CACHE" && find . -name '*.autotune.json' -print0 | tar --null -czf "$OUT/fla_autotune.tgz" -T -)
  echo "fla autotune cache: $(find "$FLA_CACHE" -name '*.autotune.json' | wc -l) kernels saved"
}
