#!/usr/bin/env bash
# Session 11, call 2 (29e0971 + the test fixes): the colsum fix (CudaNormLong, CudaNorm*), then the
# two-layer DSA model training at 131072 tokens (issue 13) that failed in call 1 at colsum.cuh.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el test; timeout 60 $D/bin/gpu_suite --gtest_filter='CudaNorm*:CudaKdaGate*:CudaConv1d*' > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|Failure|seed" "$L/suite.txt" | head; pack
el "train dsa-2l 131072"
timeout 300 $D/bin/moetrain bench step --model bench/models/dsa-2l.json --tokens 131072 --lora-rank 0 \
  --warmup 1 --steps 4 --lr 1e-3 --json "$L/step_dsa2l_131072.json" > "$L/step_dsa2l_131072.txt" 2>&1
echo "rc=$?"; grep -v "^{" "$L/step_dsa2l_131072.txt" | tail -8
python3 -c "
import json; j=json.load(open('$L/step_dsa2l_131072.json')); m=j.get('memory_check',{})
print('ms/step', round(j['ms_per_step'],1), 'tok/s', round(j['tokens_per_s']), 'losses', [round(x,4) for x in j['losses']], 'fell', j['loss_fell'], 'planned', round(m.get('planned_gib',0),2), 'measured', round(m.get('measured_gib',0),2))
print([(u['layer'], round(u['fwd_ms'],1), round(u['bwd_ms'],1)) for u in j['profile']['units']])" 2>&1 | tail -3; pack
el done
