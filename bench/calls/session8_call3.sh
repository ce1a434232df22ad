#!/usr/bin/env bash
# Session 8, call 3: full test (decode on the GPU), generate tokens/s, 8K step (grads TC),
# racecheck over the tensor-core KDA kernels, memcheck over the CUDA tests call 1 did not reach.
# Every log ends up in one tarball: the device returns only a few files.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}; L=/tmp/logs; mkdir -p "$OUT" "$L"
t0=$(date +%s); el() { echo "[t=$(( $(date +%s) - t0 ))s] $*"; }
el test; OUT=$L timeout 150 tools/gpu.sh test > "$L/test.txt" 2>&1; tail -4 "$L/test.txt"
grep -E "^\[  FAILED|^FAIL" "$L/test.txt" | head -20
D=/tmp/moetrain-gpu; export LD_LIBRARY_PATH=$D/lib:${LD_LIBRARY_PATH:-}
ids=$(python3 -c "print(','.join(str((i*7919)%150000+10) for i in range(512)))")
for dev in cuda; do
  el "generate $dev 8l"; timeout 120 $D/bin/moetrain generate --model bench/models/kimi-linear-8l.json --prompt-ids "$ids" \
    --max-new 128 --device $dev > "$L/gen_8l.txt" 2> "$L/gen_8l.err"; echo "rc=$?"; tail -4 "$L/gen_8l.err"
done
el "generate small cuda"; timeout 60 $D/bin/moetrain generate --model small --prompt-ids 5,17,3,9,11,200,31 --max-new 64 --device cuda \
  > "$L/gen_small_cuda.txt" 2> "$L/gen_small_cuda.err"; echo "rc=$?"; tail -3 "$L/gen_small_cuda.err"
el "generate small cpu"; timeout 60 $D/bin/moetrain generate --model small --prompt-ids 5,17,3,9,11,200,31 --max-new 64 --device cpu --threads 16 \
  > "$L/gen_small_cpu.txt" 2> "$L/gen_small_cpu.err"; echo "rc=$?"; tail -3 "$L/gen_small_cpu.err"
el step; OUT=$L STEPS=3 timeout 90 tools/gpu.sh bench > "$L/step.txt" 2>&1; grep -E "ms_per_step|profiled" "$L/step.txt" | cut -c1-400
python3 - "$L" <<'PY'
import json,sys,glob
for f in glob.glob(sys.argv[1]+"/bench_step_*.json"):
    j=json.load(open(f)); print(f, "ms/step", round(j["ms_per_step"],1), j["ms_steps"], "GiB", round(j["device_used_gib_over_baseline"],2), "mfu", round(j["mfu"],3))
    for u in j["profile"]["units"]: print("  ", u["layer"], round(u["fwd_ms"],2), round(u["bwd_ms"],2))
PY
el racecheck; timeout 130 compute-sanitizer --tool racecheck --error-exitcode 9 $D/bin/gpu_suite \
  --gtest_filter='CudaKdaPrepared.*:Kda/CudaKda.ForwardBackward/Chunked64_K128V64_h0_dhT_strongDecay' --gtest_brief=1 > "$L/racecheck.log" 2>&1
echo "racecheck rc=$?"; grep -E "hazard|ERROR SUMMARY|RACECHECK SUMMARY" "$L/racecheck.log" | tail -3
el memcheck; timeout 170 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 $D/bin/gpu_suite \
  --gtest_filter='CudaDecode*:CudaNccl.Coll*:CudaActivation*:CudaEmbedding*:CudaRope*:CudaOptim*:CudaConv1d*:CudaKdaGate*:CudaCrossEntropy*:CudaStepSync*:Dims/CudaNorm*:Ranks/CudaLinear*:Kda/CudaKda.ForwardBackward/Chunked64_K128V64_h0_dhT_strongDecay:Kda/CudaKda.ForwardBackward/Recurrent_K64V64_zeroState_dhT' \
  --gtest_brief=1 > "$L/memcheck.log" 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|Invalid|FAILED" "$L/memcheck.log" | tail -5
el done
tar -C "$L" -czf "$OUT/logs.tgz" . && ls -la "$OUT"
