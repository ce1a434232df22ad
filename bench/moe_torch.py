"""torch._grouped_mm's routed SwiGLU FFN at the shapes of `moetrain bench moe` (issue 14), with the
same rows per expert: A = 16384 tokens x top-8 over 64 experts, d 2048, ffn 1024; B = 8192 x top-8
over 256 experts, d 2304, ffn 1024; near-uniform routing and skewed routing (every eighth expert
hot, 30x the rows of the others: src/cli/bench_moe.cpp, expert_offsets). bf16, rows already sorted
by expert. Forward, forward+backward with a frozen base (dX only) and with the base training
(dX + dW); FLOPs counted as ../shared/bench/anchors_torch.py does. JSON lines; run in the same
device call as `moetrain bench moe`. `--device cpu --small` checks the script's own logic."""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

dev = "cpu" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu" else "cuda"
SMALL = "--small" in sys.argv


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def bench(f, warmup=2, iters=10):
    for _ in range(warmup):
        f()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        f()
    sync()
    return (time.perf_counter() - t0) * 1e3 / iters


def expert_offsets(rows, experts, skewed, hot=30):
    w = [hot if skewed and e % 8 == 0 else 1 for e in range(experts)]
    counts = [rows * x // sum(w) for x in w]
    for e in range(rows - sum(counts)):
        counts[e] += 1
    return counts


def case(name, tokens, topk, E, d, ff, skewed):
    torch.manual_seed(0)
    bf = torch.bfloat16
    rows = tokens * topk
    counts = expert_offsets(rows, E, skewed)
    offs = torch.tensor(counts, device=dev).cumsum(0).to(torch.int32)
    x = torch.randn(rows, d, device=dev, dtype=bf, requires_grad=True)
    w1 = (torch.randn(E, d, 2 * ff, device=dev) / math.sqrt(d)).to(bf)
    w2 = (torch.randn(E, ff, d, device=dev) / math.sqrt(ff)).to(bf)
    dy = torch.randn(rows, d, device=dev, dtype=bf)
    flops = 2 * rows * d * 3 * ff

    def ffn(a, b):
        h = torch._grouped_mm(x, a, offs=offs)
        g, u = h.chunk(2, -1)
        return torch._grouped_mm((F.silu(g) * u).contiguous(), b, offs=offs)

    def fwd():
        with torch.no_grad():
            ffn(w1, w2)

    def fwdbwd(a, b):
        x.grad = None
        ffn(a, b).backward(dy)

    f = bench(fwd)
    fb_frozen = bench(lambda: fwdbwd(w1, w2))
    a, b = w1.clone().requires_grad_(True), w2.clone().requires_grad_(True)
    fb_full = bench(lambda: fwdbwd(a, b))
    print(json.dumps({"bench": "torch_grouped_mm_ffn", "case": name,
                      "routing": "skewed" if skewed else "uniform", "tokens": tokens, "topk": topk,
                      "experts": E, "d": d, "ffn": ff, "max_rows_per_expert": max(counts),
                      "fwd_ms": f, "fwd_tflops": flops / f / 1e9,
                      "fwdbwd_frozen_ms": fb_frozen, "fwdbwd_frozen_tflops": 2 * flops / fb_frozen / 1e9,
                      "fwdbwd_full_ms": fb_full, "fwdbwd_full_tflops": 3 * flops / fb_full / 1e9}),
          flush=True)


shapes = [("A", 16384, 8, 64, 2048, 1024), ("B", 8192, 8, 256, 2304, 1024)]
if SMALL:
    shapes = [("A_small", 256, 2, 8, 64, 32), ("B_small", 128, 2, 16, 48, 32)]
for s in shapes:
    for skewed in (False, True):
        case(*s, skewed)
