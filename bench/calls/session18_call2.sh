#!/usr/bin/env bash
# Session 18, call 2 (issue 14): what a side product costs inside the grouped GEMM's mainloop
# (docs/plan_fused_lora.md, plan step 2's micro-gate). moetrain_probe is main's binary with the
# forward forms' default kernel (coop128x256c2x1) built with MT_SIDE_PROBE (/work/prof18/
# side_probe.patch, not committed): every k16 block also issues one m64n16k16 wgmma per warpgroup
# (A: the stage's X / dY tile, B: its first 16 rows), as X A^T or dY sB would, result unused. Per
# kernel at the running clocks (ncu) and on the wall (bench moe, alternating), both binaries.
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
xz -dc .gpu/moetrain_probe.xz > $D/bin/moetrain_probe && chmod +x $D/bin/moetrain_probe
budget=300
for c in A:uniform B:uniform; do
  for b in moetrain moetrain_probe; do
    el "ncu $c $b"; timeout 45 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv $D/bin/$b bench moe --cases $c --iters 1 --warmup 0 --lora-variants none > "$L/ncu_${c%%:*}_$b.csv" 2> "$L/ncu_${c%%:*}_$b.err"; echo "ncu rc=$?"; pack
  done
done
for round in 1 2; do
  for b in moetrain moetrain_probe; do
    el "wall $b round $round"; timeout 60 $D/bin/$b bench moe --cases A:uniform,B:uniform --iters 10 --lora-variants none --json "$L/moe_${b}_$round.json" > "$L/moe_${b}_$round.txt" 2>&1; echo "rc=$?"
    python3 -c "
import json
for r in json.load(open('$L/moe_${b}_$round.json'))['runs']: print(r['case'], r['routing'], 'fwd %.3f frozen %.3f full %.3f lora %.3f median +%.1f%%' % (r['fwd_ms'], r['fwdbwd_frozen_ms'], r['fwdbwd_full_written_ms'], r['lora_fwdbwd_ms'], 100 * r.get('lora_overhead_fwdbwd_median', float('nan'))))" 2>&1 | tail -2; pack
  done
done
el done
