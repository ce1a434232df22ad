#!/usr/bin/env python3
"""Sums an ncu --csv gpu__time_duration.sum report by kernel name.

usage: ncu_by_kernel.py REPORT.csv [DIVIDE [TOP]]
DIVIDE: how many identical steps the profiled run held (the sums are divided by it), TOP: rows.
Prints a table (ms per step, share, launches per step) and writes REPORT.json beside it.
"""
import csv
import json
import sys

SCALE = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("skinny::", "")
    name = name.replace("void ", "").split("(")[0]
    return name[:100]


def main():
    path = sys.argv[1]
    divide = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    sums = {}
    lines = [line for line in open(path) if line.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ms = float(r["Metric Value"].replace(",", "")) * SCALE.get(r["Metric Unit"], 1.0)
        name = short(r["Kernel Name"])
        total, count = sums.get(name, (0.0, 0))
        sums[name] = (total + ms, count + 1)
    rows = [{"kernel": k, "ms": v[0] / divide, "launches": v[1] / divide} for k, v in sums.items()]
    rows.sort(key=lambda r: -r["ms"])
    json.dump(rows, open(path.rsplit(".", 1)[0] + ".json", "w"), indent=1)
    total = sum(r["ms"] for r in rows)
    print(f"all kernels: {total:.2f} ms per step ({len(rows)} names)")
    for r in rows[:top]:
        print(f'{r["ms"]:8.3f} ms {100 * r["ms"] / total:5.1f}% {r["launches"]:6.1f}x  {r["kernel"]}')


if __name__ == "__main__":
    main()
