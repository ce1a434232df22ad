# Shared by the device-call scripts (session 10 on), sourced from the repository root: logs under
# $L, tarred into $OUT/logs.tgz by `pack` after each stage (the device returns only a few files);
# `el` stamps a stage with the seconds since the start; `unpack` puts the packed binaries in $D.
OUT=${OUT:-/tmp/gpu_out}; L=${L:-/tmp/logs}; mkdir -p "$OUT" "$L"
D=/tmp/moetrain-gpu
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
# Seconds left of the call's $budget (a script sets it; 600, the per-call limit, by default).
left() { echo $(( ${budget:-600} - ($(date +%s) - t0) )); }
pack() { tar -C "$L" -czf "$OUT/logs.tgz" .; }
unpack() {
  # Python's lzma where the image lacks xz.
  mkdir -p "$D" && { tar -C "$D" -xJf .gpu/pack.tar.xz 2>/dev/null ||
    python3 -c "import tarfile, sys; tarfile.open('.gpu/pack.tar.xz').extractall(sys.argv[1])" "$D"; }
  export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
}
# main's moetrain, carried beside a branch's pack as .gpu/moetrain_main.xz, into $D/bin/moetrain_main
# (Python's lzma where the image lacks xz): the A/B calls run both binaries in one call.
unpack_main() {
  xz -dc .gpu/moetrain_main.xz > $D/bin/moetrain_main 2>/dev/null ||
    python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" .gpu/moetrain_main.xz $D/bin/moetrain_main
  chmod +x $D/bin/moetrain_main
}
# One line of a `bench step` JSON: time, throughput, memory against the plan, and the units.
step_line() { python3 -c "
import json; j=json.load(open('$1')); m=j.get('memory_check',{})
print('ms/step', round(j['ms_per_step'],1), 'tok/s', round(j['tokens_per_s']), 'measured', round(m.get('measured_gib',0),2), 'planned', round(m.get('planned_gib',0),2), 'fell', j.get('loss_fell'))
print([(u['layer'], round(u['fwd_ms'],1), round(u['bwd_ms'],1)) for u in j['profile']['units']])" 2>&1 | tail -2; }
# The expert-LoRA step under the kernel tracer (tools/kernel_trace) for each binary of $D/bin named
# in the arguments: the step's line and its largest kernels by name.
traced_steps() {
  local T=$PWD/.gpu/trace b
  for b in "$@"; do
    el "step $b"
    MT_KERNEL_TRACE=$L/step_$b.csv LD_PRELOAD=$T/libkernel_trace.so LD_LIBRARY_PATH=$T:$LD_LIBRARY_PATH \
      timeout 90 $D/bin/$b bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 \
      --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts --json "$L/step_$b.json" > "$L/step_$b.txt" 2>&1; echo "rc=$?"
    step_line "$L/step_$b.json"
    python3 "$T/summarize.py" "$L/step_$b.csv" --by-name 14 | head -16; pack
  done
}
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
# `bench moe`'s runs ($L/bench_moe.json) against torch._grouped_mm's ($L/moe_torch.jsonl, from
# bench/moe_torch.py in the next command): per case the times and ratios, the LoRA overhead
# (eager, and the median of alternating rounds where the binary reports it), host-issue times
# and graph replays where present.
moe_vs_torch() { python3 - "$L" <<'PY' 2>&1 | tail -16
import json, sys
L = sys.argv[1]
t = {(x['case'], x['routing']): x for x in map(json.loads, [l for l in open(L + '/moe_torch.jsonl') if l.startswith('{')])}
for r in json.load(open(L + '/bench_moe.json'))['runs']:
    a = t[(r['case'], r['routing'])]
    keep_h = r.get('fwdbwd_full_written_keep_h_ms', float('nan'))
    print(r['case'], r['routing'], 'fwd %.3f (%.3fx) frozen %.3f (%.3fx) written %.3f (%.3fx) keep_h %.3f (%.3fx) lora %.3f (+%.1f%%, median of rounds +%.1f%%)' % (
        r['fwd_ms'], a['fwd_ms'] / r['fwd_ms'], r['fwdbwd_frozen_ms'], a['fwdbwd_frozen_ms'] / r['fwdbwd_frozen_ms'],
        r['fwdbwd_full_written_ms'], a['fwdbwd_full_ms'] / r['fwdbwd_full_written_ms'], keep_h, a['fwdbwd_full_ms'] / keep_h,
        r['lora_fwdbwd_ms'], 100 * r['lora_overhead_fwdbwd'], 100 * r.get('lora_overhead_fwdbwd_median', float('nan'))))
    print('   torch %s; host ms frozen %s lora %s; graph frozen %s lora %s; rounds frozen %s lora %s' % (
        (round(a['fwd_ms'], 3), round(a['fwdbwd_frozen_ms'], 3), round(a['fwdbwd_full_ms'], 3)),
        r.get('fwdbwd_frozen_host_ms'), r.get('lora_fwdbwd_host_ms'), r.get('graph_fwdbwd_frozen_ms'), r.get('graph_lora_fwdbwd_ms'),
        [round(v, 2) for v in r.get('fwdbwd_frozen_rounds_ms', [])], [round(v, 2) for v in r.get('lora_fwdbwd_rounds_ms', [])]))
PY
}
