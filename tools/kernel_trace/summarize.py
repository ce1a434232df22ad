#!/usr/bin/env python3
"""Summarises a kernel_trace.c timeline (CSV) by burst.

A burst is a run of kernels with no idle gap over --gap-us between them (a benchmark's timed
loop: the host waits on its events between loops). Within a burst the kernels repeat with some
period (one forward+backward); per burst this prints the wall time per period, the busy time
(kernels running) per period, and with --detail each kernel position's median duration, so that a
back-to-back run's per-kernel times can be set beside ncu's isolated ones.

  summarize.py trace.csv [--gap-us 50] [--detail] [--match REGEX] [--smi smi.csv] [--json out.json]
  summarize.py trace.csv --by-name 40 [--json out.json]

--by-name N: instead, every kernel's time summed by name, the top N as a table (a whole training
step's split, as Nsight Systems' kernel summary gives it).

--smi: nvidia-smi samples taken beside the run in UTC (`TZ=UTC nvidia-smi --query-gpu=timestamp,
clocks.sm,clocks.mem,power.draw --format=csv,noheader -lms 100`): each burst's mean SM clock and
power over the samples within it.
"""
import argparse
import csv
import datetime
import json
import re
import shutil
import statistics
import subprocess
import sys


def demangle(names):
    """CUPTI's mangled names through c++filt where there is one."""
    names = sorted(set(names))
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def short(name):
    n = re.sub(r"\((anonymous namespace|<unnamed>)\)::|mt::ops::cuda::|skinny::|mt::|void ", "", name)
    s = re.sub(r"<.*", "", n.split("(")[0])[:48]
    if s.startswith("_ZN7cutlass13device_kernel"):  # CUPTI cuts CUTLASS's names past demangling
        s = "cutlass::device_kernel"
    # A generic kernel over a lambda (for_each_index_kernel): named by the function holding it.
    lam = re.search(r"<([\w:]+)\(.*?\)::\{lambda\(.*?\)#(\d+)\}", n)
    if lam:
        s += f"<{lam.group(1)} lambda #{lam.group(2)}>"
    for tag, mark in (("TailTrimmed", "[tail]"), ("Pingpong", "[pp]"), ("LoraXa", "[lora]")):
        if tag in name:
            s += mark
    return s


def period_of(names):
    """The smallest p for which names repeat with period p (len(names) if none does)."""
    for p in range(1, len(names) // 2 + 1):
        if len(names) % p == 0 and all(names[i] == names[i % p] for i in range(len(names))):
            return p
    return len(names)


def read_smi(path):
    """[(unix_ns, sm_mhz, watts)] from nvidia-smi's CSV samples (UTC timestamps)."""
    out = []
    for line in open(path):
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f")
            t = t.replace(tzinfo=datetime.timezone.utc)
            out.append((int(t.timestamp() * 1e9), float(f[1].split()[0]), float(f[3].split()[0])))
        except (ValueError, IndexError):
            continue
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--gap-us", type=float, default=50)
    ap.add_argument("--detail", action="store_true")
    ap.add_argument("--match", default="", help="only bursts with a kernel matching this regex")
    ap.add_argument("--smi", default="")
    ap.add_argument("--by-name", type=int, default=0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    offset = None  # unix ns minus CUPTI ns
    with open(a.trace) as f:
        lines = []
        for line in f:
            if line.startswith("#clock,"):
                c = line.strip().split(",")
                offset = int(c[2]) - int(c[1])
            else:
                lines.append(line)
        ks = sorted((int(r["start_ns"]), int(r["end_ns"]), r["name"]) for r in csv.DictReader(lines))
    full = demangle(k[2] for k in ks)
    ks = [(s, e, full[n]) for s, e, n in ks]
    smi = read_smi(a.smi) if a.smi and offset is not None else []
    if a.by_name:
        by = {}
        for s, e, n in ks:
            t = by.setdefault(short(n), [0.0, 0])
            t[0] += (e - s) / 1e6
            t[1] += 1
        rows = sorted(({"kernel": k, "ms": v[0], "calls": v[1]} for k, v in by.items()),
                      key=lambda r: -r["ms"])
        total = sum(r["ms"] for r in rows)
        print(f"all kernels: {total:.1f} ms, {sum(r['calls'] for r in rows)} launches")
        for r in rows[: a.by_name]:
            print(f'{r["ms"]:9.2f} ms {100 * r["ms"] / total:5.1f}% {r["calls"]:6d}  {r["kernel"]}')
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    if not ks:
        sys.exit("summarize: no kernels in " + a.trace)
    bursts, cur = [], [ks[0]]
    for k in ks[1:]:
        if k[0] - max(c[1] for c in cur[-4:]) > a.gap_us * 1e3:
            bursts.append(cur)
            cur = []
        cur.append(k)
    bursts.append(cur)
    out = []
    for i, b in enumerate(bursts):
        names = [k[2] for k in b]
        if a.match and not any(re.search(a.match, k[2]) for k in b):
            continue
        p = period_of(names)
        reps = len(b) // p
        wall = (b[-1][1] - b[0][0]) / 1e3 / reps
        busy = sum(k[1] - k[0] for k in b) / 1e3 / reps
        per = [
            (short(names[j]), statistics.median((b[j + p * r][1] - b[j + p * r][0]) / 1e3 for r in range(reps)))
            for j in range(p)
        ]
        rec = {"burst": i, "kernels": len(b), "period": p, "reps": reps,
               "wall_us_per_period": wall, "busy_us_per_period": busy, "per_kernel_us": per}
        line = (f"burst {i}: {len(b)} kernels, period {p} x {reps}: wall {wall:.1f} us, "
                f"busy {busy:.1f} us per period")
        inside = [s for s in smi if b[0][0] + offset <= s[0] <= b[-1][1] + offset]
        if inside:
            rec["sm_mhz"] = statistics.mean(s[1] for s in inside)
            rec["watts"] = statistics.mean(s[2] for s in inside)
            line += f"; {len(inside)} samples: {rec['sm_mhz']:.0f} MHz, {rec['watts']:.0f} W"
        out.append(rec)
        print(line)
        if a.detail:
            for n, us in per:
                print(f"    {us:9.1f}  {n}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
