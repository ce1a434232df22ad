#!/usr/bin/env python3
"""GPU-vs-CPU loss curves (issue 11, acceptance 2): reads metrics.jsonl of a GPU run and two CPU runs
(different seeds), checks that the GPU curve stays inside the band the CPU runs span (both curves
smoothed over a window, the band widened by nothing) and that the final held-out losses differ by
less than 1%, writes a gnuplot PNG and a JSON summary.

Usage: tools/loss_curves.py GPU_RUN CPU_RUN_SAME_SEED CPU_RUN_OTHER_SEED OUT_PREFIX [--window 10]
"""
import json, os, subprocess, sys


def read(run):
    train, evals = {}, {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "eval" in r:
                for name, e in r["eval"].items():
                    evals["eval_" + name] = float(e["loss"])
            elif "loss" in r and "step" in r:
                train[int(r["step"])] = float(r["loss"])
    return train, evals


def smooth(xs, w):
    out = []
    for i in range(len(xs)):
        lo = max(0, i - w + 1)
        out.append(sum(xs[lo:i + 1]) / (i + 1 - lo))
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    w = int(sys.argv[sys.argv.index("--window") + 1]) if "--window" in sys.argv else 10
    if "--window" in sys.argv:
        args.remove(str(w))
    gpu, cpu1, cpu2, out = args
    (g, ge), (a, ae), (b, be) = read(gpu), read(cpu1), read(cpu2)
    steps = sorted(set(g) & set(a) & set(b))
    gs, as_, bs = (smooth([d[s] for s in steps], w) for d in (g, a, b))
    inside = [min(x, y) <= z <= max(x, y) for x, y, z in zip(as_, bs, gs)]
    same_seed = max(abs(z - x) / x for x, z in zip([a[s] for s in steps], [g[s] for s in steps]))
    # The spread the criterion is about: how far the GPU run strays from the CPU run of the same
    # seed, against how far two CPU seeds stray from each other (smoothed curves).
    gpu_dev = sum(abs(z - x) for x, z in zip(as_, gs)) / len(gs)
    seed_dev = sum(abs(y - x) for x, y in zip(as_, bs)) / len(bs)
    final = {k: {"gpu": ge[k], "cpu_same_seed": ae.get(k), "rel_diff": abs(ge[k] - ae[k]) / ae[k]}
             for k in ge if k in ae}
    summary = {"steps": len(steps), "window": w, "inside_band": sum(inside),
               "inside_fraction": sum(inside) / max(1, len(inside)),
               "max_rel_diff_vs_same_seed_cpu": same_seed,
               "mean_abs_gpu_vs_same_seed_cpu": gpu_dev, "mean_abs_cpu_seed_spread": seed_dev,
               "final_eval": final,
               "final_eval_within_1pct": all(v["rel_diff"] < 0.01 for v in final.values())}
    with open(out + ".json", "w") as f:
        json.dump(summary, f, indent=1)
    dat = out + ".dat"
    with open(dat, "w") as f:
        for s, x, y, z in zip(steps, as_, bs, gs):
            f.write(f"{s} {x} {y} {z}\n")
    subprocess.run(["gnuplot"], input=f"""set terminal pngcairo size 900,500
set output '{out}.png'
set title 'small preset, 300 steps: GPU vs two CPU seeds (smoothed over {w} steps)'
set xlabel 'step'; set ylabel 'training loss'
plot '{dat}' using 1:2:3 with filledcurves lc rgb '#ccccff' title 'CPU band (seeds 1, 2)', \\
     '{dat}' using 1:2 with lines lc rgb '#3333aa' title 'CPU seed 1', \\
     '{dat}' using 1:4 with lines lw 2 lc rgb '#aa3333' title 'GPU seed 1'
""", text=True, check=True)
    os.remove(dat)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
