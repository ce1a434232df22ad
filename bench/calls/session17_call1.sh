#!/usr/bin/env bash
# Session 17, call 1 (issue 14): where the expert-LoRA and full-training time goes, per kernel at the
# real clocks, next to the wall times and torch._grouped_mm in the same call; a grouped GEMM sweep
# for shape B's forward. Binaries: main at session 16's head (c3be348).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el moe; timeout 90 $D/bin/moetrain bench moe --iters 10 --lora-variants none --json "$L/bench_moe.json" > "$L/moe.txt" 2>&1; echo "rc=$?"
timeout 60 python3 bench/moe_torch.py > "$L/moe_torch.jsonl" 2> "$L/moe_torch.err"; echo "torch rc=$?"
moe_vs_torch
pack
for c in A:uniform B:uniform; do
  el "ncu $c"; timeout 100 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/moetrain bench moe --cases $c --iters 1 --warmup 1 --lora-variants none > "$L/ncu_${c%%:*}.csv" 2> "$L/ncu_${c%%:*}.err"; echo "ncu rc=$?"; pack
done
el sweep; timeout 120 $D/bin/moetrain bench moe --cases B:uniform,A:uniform --base-only --iters 10 --gemm coop128x256c2x1,coop128x256c2x1:swiglu=fwd,coop128x256c2x1:down=coop128x256c2x1,coop128x256c2x1:down=pingpong64x256c2x1,coop128x256c2x1:s2,coop128x256c2x1:n,coop256x128c2x1,coop128x256c1x2,pingpong128x128c2x1,coop128x256c2x1 --json "$L/sweep.json" > "$L/sweep.txt" 2>&1; echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$L/sweep.json'))['runs']: print(r['case'], r['grouped_gemm'], {k[:-3]: round(v, 3) for k, v in r.items() if k.endswith('_ms')})" 2>&1 | tail -22; pack
el done
