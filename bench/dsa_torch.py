"""Plain-PyTorch DSA in the benchmark layer's layout, the reference for `moetrain bench dsa`.

The layer (issue 13): 32 query heads with their own keys, q/k 192 (128 nope + 64 rope), v 128;
lightning indexer 8 heads x 64 with one shared key, top-2048, bf16, batch 1. Written as DeepSeek's
reference (inference/model.py) does it: indexer scores as a [T, T] fp32 table with the causal mask,
torch.topk, then attention under an index mask (-inf off the selected keys) through
scaled_dot_product_attention. The indexer's KL loss is not timed (PyTorch's fused attention does
not return its probabilities); `moetrain bench dsa` reports ours separately.

Run on the GPU machine:  python3 bench/dsa_torch.py [--tokens 8192,32768,65536,131072]
Prints one JSON object: per T, each part's median time (ms) and peak allocated memory (GiB), and
"oom": the part that ran out of memory, where one did (the rest of that T is skipped).
"""
import argparse
import json

import torch
import torch.nn.functional as F

H, DQK, DV, HI, DI, TOPK = 32, 192, 128, 8, 64, 2048
dev = "cuda"


def bench(fn, warmup=2, iters=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def measure(fn, **kw):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ms = bench(fn, **kw)
    return {"ms": ms, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def run(T):
    torch.manual_seed(0)
    bf = torch.bfloat16
    q = torch.randn(1, H, T, DQK, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(1, H, T, DQK, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(1, H, T, DV, device=dev, dtype=bf, requires_grad=True)
    do = torch.randn(1, H, T, DV, device=dev, dtype=bf)
    qi = torch.randn(T, HI, DI, device=dev, dtype=bf)
    ki = torch.randn(T, DI, device=dev, dtype=bf)
    w = (torch.randn(T, HI, device=dev) * HI**-0.5).to(bf)
    topk = min(TOPK, T)

    def indexer():
        s = torch.zeros(T, T, device=dev, dtype=torch.float32)
        for h in range(HI):  # one [T, T] head at a time, as a memory-aware user would
            s += w[:, h, None].float() * (qi[:, h] @ ki.T).float().relu()
        s *= DI**-0.5
        return s.masked_fill_(torch.ones(T, T, device=dev, dtype=torch.bool).triu_(1), float("-inf"))

    def select(s):
        idx = s.topk(topk, dim=-1).indices
        mask = torch.full((T, T), float("-inf"), device=dev, dtype=bf)
        mask.scatter_(-1, idx, 0.0)
        # Rows with fewer than top-k causal keys picked masked slots: mask them again.
        return mask.masked_fill_(torch.ones(T, T, device=dev, dtype=torch.bool).triu_(1), float("-inf"))

    def attend(mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    res = {"T": T}
    parts = {}
    try:
        with torch.no_grad():
            parts["indexer_fwd"] = measure(indexer)
            scores = indexer()
            parts["selection_fwd"] = measure(lambda: select(scores))
            mask = select(scores)
            del scores
            parts["attention_fwd"] = measure(lambda: attend(mask))
        parts["attention_fwdbwd"] = measure(lambda: attend(mask).backward(do))
        del mask

        def layer_fwd():
            with torch.no_grad():
                m = select(indexer())
                attend(m)

        def layer_fwdbwd():
            with torch.no_grad():
                m = select(indexer())
            attend(m).backward(do)

        parts["layer_fwd"] = measure(layer_fwd)
        parts["layer_fwdbwd"] = measure(layer_fwdbwd)
    except torch.cuda.OutOfMemoryError:
        res["oom"] = next(n for n in ["indexer_fwd", "selection_fwd", "attention_fwd",
                                      "attention_fwdbwd", "layer_fwd", "layer_fwdbwd"]
                          if n not in parts)
    res.update(parts)
    del q, k, v, do, qi, ki, w
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="8192,32768,65536,131072")
    a = ap.parse_args()
    out = {"layer": {"heads": H, "qk_dim": DQK, "v_dim": DV, "index_heads": HI,
                     "index_head_dim": DI, "topk": TOPK, "dtype": "bf16", "batch": 1,
                     "form": "index mask + scaled_dot_product_attention (DeepSeek's reference)"},
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "device_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
           "runs": []}
    for T in [int(t) for t in a.tokens.split(",")]:
        out["runs"].append(run(T))
        print(json.dumps(out["runs"][-1]), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
