#!/usr/bin/env bash
# Session 19, call 3 (issue 14): after the 128-byte weight pitch, every LoRA kernel variant beside
# the default (bench moe --lora-variants all: the SwiGLU passes' staged / registers kernels, the
# out_grads passes, xa) at A and B uniform; the whole GPU suite.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
budget=560
el suite; timeout 200 $D/bin/gpu_suite > "$L/suite.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|tests ran|FAILED  \]|seed=" "$L/suite.txt" | head -12; pack
l=$(left); el "moe variants (${l}s left)"
timeout $(( l - 60 )) $D/bin/moetrain bench moe --iters 10 --cases A:uniform,B:uniform --lora-variants all --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 50 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch
python3 -c "
import json
for r in json.load(open('$L/bench_moe.json'))['runs']:
  print(r['case'], r['routing'], 'frozen %.3f lora %.3f' % (r['fwdbwd_frozen_ms'], r['lora_fwdbwd_ms']), {k[5:-10]: round(v, 3) for k, v in r.items() if k.startswith('lora_') and k.endswith('_fwdbwd_ms')})" 2>&1 | tail -4
pack; el done
