#!/usr/bin/env bash
# Session 16, call 1: what session 15's last commits need on a GPU (next_session16.sh without the
# sparse MQA case: issue 13 is blocked), the MoE tests for the grouped_ffn refactor, the step under
# Nsight Systems (issue 12: the KDA core's share of the step's kernel time) and Nsight Compute's DRAM
# bytes for the KDA kernels at B2 T8192 (issue 12: achieved HBM bandwidth per kernel).
set -u
cd "$(dirname "$0")/../.."
. bench/calls/lib.sh
unpack
el kda; timeout 170 $D/bin/gpu_suite --gtest_filter='*Kda*' > "$L/suite_kda.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=" "$L/suite_kda.txt" | head -12; pack
for k in prep_tc fwd_state_v2; do
  timeout 50 compute-sanitizer --tool racecheck --error-exitcode 9 --kernel-name kns=$k $D/bin/gpu_suite --gtest_filter='KdaTc/CudaKdaTc.ForwardBackwardAgainstTheCpu/H32K128V128_T300_docs1_h0_dhT_mild' > "$L/racecheck_$k.txt" 2>&1; echo "racecheck $k rc=$?"; grep -E "SUMMARY|PASSED|FAILED" "$L/racecheck_$k.txt" | head -3
done; pack
el model moe; timeout 90 $D/bin/gpu_suite --gtest_filter='*CudaModel*:CudaGroupedFfn.*:CudaLoraGrouped.*:*CudaMoe*:CudaGroupedMatmul*' > "$L/suite_model_moe.txt" 2>&1; echo "rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|seed=" "$L/suite_model_moe.txt" | head -12; pack
el ncu kda; timeout 60 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv $D/bin/moetrain bench kda --cases B2_T8192 --iters 1 --warmup 0 > "$L/ncu_kda.csv" 2> "$L/ncu_kda.err"; echo "ncu rc=$?"
python3 - "$L/ncu_kda.csv" <<'PY' 2>&1 | tail -30
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ix = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
by = collections.OrderedDict()
for r in rows[1:]:
    k = (r[ix["ID"]], r[ix["Kernel Name"]][:60]); by.setdefault(k, {})[r[ix["Metric Name"]]] = float(r[ix["Metric Value"]].replace(",", ""))
for (i, n), m in by.items():
    t = m.get("gpu__time_duration.sum", 0); b = m.get("dram__bytes_read.sum", 0) + m.get("dram__bytes_write.sum", 0)
    print(f"{i:>4} {n:60s} {t/1e3:8.1f} us  rd {m.get('dram__bytes_read.sum',0)/1e6:8.1f} MB wr {m.get('dram__bytes_write.sum',0)/1e6:8.1f} MB  {b/t if t else 0:7.1f} GB/s")
PY
pack
el step; timeout 65 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step.json" > "$L/step.txt" 2>&1; echo "rc=$?"; step_line "$L/step.json"; pack
el step experts; timeout 75 $D/bin/moetrain bench step --model bench/models/kimi-linear-8l.json --tokens 8192 --steps 3 --warmup 1 --json "$L/step_experts.json" --lora-targets attention,kda,shared_experts,dense_ffn,routed_experts > "$L/step_experts.txt" 2>&1; echo "rc=$?"; step_line "$L/step_experts.json"; pack
el nsys; OUT=$L TOP=30 timeout 80 tools/gpu.sh nsys > "$L/nsys.txt" 2>&1; echo "rc=$?"; head -32 "$L/nsys.txt"; pack
el done
