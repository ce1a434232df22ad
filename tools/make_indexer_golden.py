#!/usr/bin/env python3
"""Goldens for the DSA lightning indexer's gradients, from PyTorch autograd (float64).

transformers runs the DeepSeek-V3.2 indexer under no_grad, so the model goldens (make_golden.py)
hold no indexer gradient. This builds the indexer and its training loss from the published
formulas (DeepSeek-V3.2-Exp report, section 2.1):

    I[t, s] = scale * sum_j w[t, j] * ReLU(q[t, j, :] . k[s, :])        scale = head_dim^-0.5
    L       = (1/T) sum_t KL(p_t || softmax_s(I[t, s]))                   over the row's slots
    p_t     = target_t / sum_s target_t[s]                                (L1-normalised)

written with torch's own einsum / log_softmax / xlogy, and differentiates L with autograd. The
slots of row t come from an index table (-1 = unused), as moetrain's ops take them. Inputs are
drawn in float32 (the values the C++ test feeds its fp32 ops exactly) and computed in float64.

Writes tests/ops/golden/indexer.safetensors: per case C in (dense, sparse):
    C.q [T, H, D], C.k [T, D], C.w [T, H], C.target [T, K] f32; C.indices [T, K] i32;
    C.scores [T, K], C.loss [1], C.dq, C.dk, C.dw (float64 results stored as f64)
Usage: python3 tools/make_indexer_golden.py (a python with torch) [--out PATH] [--seed N]
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file


def dense_table(lengths):
    """Row t lists its document's positions start..t, then -1 (causal attention)."""
    T, K = sum(lengths), max(lengths)
    idx = torch.full((T, K), -1, dtype=torch.int32)
    b = 0
    for n in lengths:
        for r in range(b, b + n):
            idx[r, : r - b + 1] = torch.arange(b, r + 1, dtype=torch.int32)
        b += n
    return idx


def sparse_table(lengths, K, gen):
    """Random sorted subsets of each row's causal positions; every 7th row empty."""
    T = sum(lengths)
    idx = torch.full((T, K), -1, dtype=torch.int32)
    b = 0
    for n in lengths:
        for r in range(b, b + n):
            if r % 7 == 3:
                continue
            pos = [s for s in range(b, r + 1) if torch.rand((), generator=gen) < 0.6][:K]
            idx[r, : len(pos)] = torch.tensor(pos, dtype=torch.int32)
        b += n
    return idx


def indexer_loss(q, k, w, target, idx):
    T, H, D = q.shape
    valid = idx >= 0
    safe = idx.clamp(min=0).long()
    # dot[t, j, s]: every head of query t against every key, then gathered on the row's slots.
    dot = torch.einsum("thd,sd->ths", q, k)
    rel = torch.relu(dot.gather(2, safe.unsqueeze(1).expand(T, H, safe.shape[1])))
    scores = (D ** -0.5) * torch.einsum("th,thj->tj", w, rel)
    scores = scores.masked_fill(~valid, 0.0)
    logq = torch.log_softmax(scores.masked_fill(~valid, float("-inf")), dim=1)
    tgt = target.masked_fill(~valid, 0.0)
    mass = tgt.sum(dim=1, keepdim=True)
    rows = (mass.squeeze(1) > 0) & valid.any(dim=1)
    p = torch.where(mass > 0, tgt / mass.clamp(min=1e-300), torch.zeros_like(tgt))
    logq = torch.where(valid, logq, torch.zeros_like(logq))
    kl = (torch.xlogy(p, p) - p * logq).sum(dim=1)
    loss = kl[rows].sum() / T
    return scores, loss


def case(name, lengths, H, D, table, gen, out):
    T = sum(lengths)
    K = table.shape[1]
    q32 = torch.randn(T, H, D, generator=gen, dtype=torch.float32)
    k32 = torch.randn(T, D, generator=gen, dtype=torch.float32)
    w32 = torch.randn(T, H, generator=gen, dtype=torch.float32) * H ** -0.5
    t32 = torch.rand(T, K, generator=gen, dtype=torch.float32)
    t32[5] = 0  # a row whose target is all zero contributes nothing
    q, k, w = (x.double().requires_grad_(True) for x in (q32, k32, w32))
    scores, loss = indexer_loss(q, k, w, t32.double(), table)
    loss.backward()
    out.update({f"{name}.q": q32, f"{name}.k": k32, f"{name}.w": w32, f"{name}.target": t32,
                f"{name}.indices": table, f"{name}.scores": scores.detach(),
                f"{name}.loss": loss.detach().reshape(1), f"{name}.dq": q.grad,
                f"{name}.dk": k.grad, f"{name}.dw": w.grad})


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "ops", "golden",
                                                  "indexer.safetensors"))
    ap.add_argument("--seed", type=int, default=18)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(a.seed)
    out = {}
    case("dense", [23, 14], 4, 8, dense_table([23, 14]), gen, out)
    case("sparse", [30, 19], 3, 16, sparse_table([30, 19], 12, gen), gen, out)
    meta = {"torch": torch.__version__, "seed": str(a.seed), "script": "tools/make_indexer_golden.py"}
    save_file({k: v.contiguous() for k, v in out.items()}, a.out, metadata=meta)
    print(json.dumps({k: list(v.shape) for k, v in out.items()}))


if __name__ == "__main__":
    main()
