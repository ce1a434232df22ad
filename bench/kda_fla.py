"""fla 0.6.0's chunk_kda at the shapes of `moetrain bench kda` (issue 12): B2 T8192 and B1 T65536
with H32 D128, and 16 packed documents (cu_seqlens) of 16384 tokens. bf16 q/k/v/g/beta, the gate
given as a log decay (as our core takes it), forward and forward+backward, printing JSON lines.
Run in the same device call as `moetrain bench kda`; fla's Triton autotuning is warmed first.
`--l2norm`: q/k L2-normalised inside fla's kernel (the anchor script's call); by default fla gets
unit rows already, as our core does. `--skip-long`: leave out B1 T65536. Each case is followed by
the same with the decay gate inside fla's kernel (use_gate_in_kernel: the raw gate, A_log and
dt_bias in, "gate_in_kernel": true), against `moetrain bench kda`'s gate_core_* timings.
`--cases a,b`: only these cases (B2_T8192, B2_T8192_gate, packed16_T16384, packed16_T16384_gate,
B1_T65536). `--autotune-cache DIR`: Triton keeps each kernel's autotuning result in DIR
(TRITON_CACHE_AUTOTUNING), so a later process, or a later device call given the same DIR's
*.autotune.json files back (bench/calls/lib.sh: fla_cache_restore / fla_cache_save), skips the
benchmarking of every config; a call that runs out of time keeps the kernels it finished.
`--dump FILE [--seed S]`: the packed case's inputs with random values, fla's output and gradients
and a float64 recurrence's output, for the comparison in tests/cuda/test_cuda_kda_fla.cpp
(MOETRAIN_FLA_KDA=FILE gpu_suite --gtest_filter=CudaKdaFla.*)."""
import json
import os
import sys
import time


def arg(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


# Before torch and Triton are imported: Triton reads these when it first autotunes.
if arg("--autotune-cache"):
    os.environ["TRITON_CACHE_DIR"] = arg("--autotune-cache")
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
    os.environ.setdefault("TRITON_PRINT_AUTOTUNING", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from fla.ops.kda import chunk_kda  # noqa: E402

dev = "cuda"
L2 = "--l2norm" in sys.argv
CASES = arg("--cases").split(",") if arg("--cases") else None
PACKED = [100, 1500, 700, 2300, 64, 900, 1200, 333, 1777, 450, 2048, 129, 1000, 640, 1111, 2132]


def bench(f, warmup=2, iters=10):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


def launches(f):
    """Kernels one call of f launches (torch's profiler, after warm-up: no autotuning inside)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        f()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())


def saved_gib(f, inputs):
    """GiB that autograd keeps from the forward for the backward beside the inputs themselves
    (distinct storages, the inputs' excluded)."""
    seen, total = {t.untyped_storage().data_ptr() for t in inputs}, 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o, _ = f()
    del o
    return total / 2**30


def case(name, B, T, H, D, cu=None, gate=False):
    label = name + (" gate" if gate else "")
    print(f"[{time.strftime('%H:%M:%S')}] {label}: autotuning", file=sys.stderr, flush=True)
    torch.manual_seed(0)
    bf = torch.bfloat16
    q = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).to(bf).requires_grad_(True)
    k = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).to(bf).requires_grad_(True)
    v = torch.randn(B, T, H, D, device=dev, dtype=bf, requires_grad=True)
    g = torch.full((B, T, H, D), -0.05, device=dev, dtype=bf, requires_grad=True)
    beta = torch.full((B, T, H), 0.5, device=dev, dtype=bf, requires_grad=True)
    do = torch.randn(B, T, H, D, device=dev, dtype=bf)
    kw = dict(use_qk_l2norm_in_kernel=L2)
    if gate:  # g holds the raw gate; fla forms -exp(A_log) softplus(g + dt_bias) in its cumsum
        g = torch.randn(B, T, H, D, device=dev, dtype=bf, requires_grad=True)
        a_log = (0.5 * torch.randn(H, device=dev)).requires_grad_(True)
        dt_bias = (0.1 * torch.randn(H * D, device=dev)).requires_grad_(True)
        kw.update(use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias)
    if cu is not None:
        kw["cu_seqlens"] = cu

    def fwd():
        with torch.no_grad():
            chunk_kda(q, k, v, g, beta, **kw)

    def fwdbwd():
        o, _ = chunk_kda(q, k, v, g, beta, **kw)
        o.backward(do)

    fwdbwd()  # autotune
    torch.cuda.synchronize()
    f, fb = bench(fwd), bench(fwdbwd)
    print(json.dumps({"bench": "fla_chunk_kda", "case": name, "tokens": B * T, "H": H, "D": D,
                      "l2norm_in_kernel": L2, "gate_in_kernel": gate, "fwd_ms": f, "fwdbwd_ms": fb,
                      "launches_fwd": launches(fwd), "launches_fwdbwd": launches(fwdbwd),
                      "saved_for_backward_gib": saved_gib(lambda: chunk_kda(q, k, v, g, beta, **kw),
                                                          (q, k, v, g, beta))}), flush=True)


def recurrence_fp64(q, k, v, g, beta, cu, scale):
    """The KDA recurrence token by token in float64 (o only): per document from a zero state,
    S = diag(exp(g_t)) S; u = v_t - S^T k_t; S += beta_t k_t u^T; o_t = scale S^T q_t."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    T, H, K = q.shape
    o = torch.empty(T, H, v.shape[-1], dtype=torch.float64, device=dev)
    for n in range(len(cu) - 1):
        S = torch.zeros(H, K, v.shape[-1], dtype=torch.float64, device=dev)
        for t in range(int(cu[n]), int(cu[n + 1])):
            S = S * g[t].exp()[:, :, None]
            u = v[t] - torch.einsum("hkv,hk->hv", S, k[t])
            S = S + beta[t][:, None, None] * k[t][:, :, None] * u[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", S, q[t])
    return o


def dump(path):
    """The packed case's inputs with fresh random values (q, k unit rows, mild log decays, beta in
    (0, 1), all bf16 so that both sides read the same numbers), fla's output and gradients, and a
    float64 recurrence's output, for tests/cuda/test_cuda_kda_fla.cpp (MOETRAIN_FLA_KDA=path)."""
    from safetensors.torch import save_file
    seed = int(arg("--seed", str(int(time.time()))))
    print(f"kda_fla.py --dump: seed {seed}", file=sys.stderr, flush=True)
    torch.manual_seed(seed)
    T, H, D, bf = sum(PACKED), 32, 128, torch.bfloat16
    cu32 = torch.tensor([0] + list(torch.tensor(PACKED).cumsum(0)), dtype=torch.int32)
    q = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).to(bf).requires_grad_(True)
    k = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).to(bf).requires_grad_(True)
    v = torch.randn(1, T, H, D, device=dev, dtype=bf, requires_grad=True)
    g = (-F.softplus(-(1.5 * torch.randn(1, T, H, D, device=dev) + 2))).to(bf).requires_grad_(True)
    beta = torch.sigmoid(torch.randn(1, T, H, device=dev)).to(bf).requires_grad_(True)
    do = torch.randn(1, T, H, D, device=dev, dtype=bf)
    o, _ = chunk_kda(q, k, v, g, beta, cu_seqlens=cu32.to(dev).long())
    o.backward(do)
    torch.cuda.synchronize()
    ref = recurrence_fp64(q[0], k[0], v[0], g[0], beta[0], cu32.tolist(), D ** -0.5)
    out = {"q": q[0], "k": k[0], "v": v[0], "g": g[0], "beta": beta[0], "do": do[0],
           "fla_o": o[0], "fla_dq": q.grad[0], "fla_dk": k.grad[0], "fla_dv": v.grad[0],
           "fla_dg": g.grad[0], "fla_dbeta": beta.grad[0], "o_fp64": ref.float()}
    out = {n: t.detach().contiguous().cpu() for n, t in out.items()}
    out["cu_seqlens"] = cu32
    save_file(out, path + ".tmp")
    os.replace(path + ".tmp", path)
    print(f"kda_fla.py --dump: {path} written", file=sys.stderr, flush=True)


if arg("--dump"):
    dump(arg("--dump"))
    sys.exit(0)

# The long case last: its first autotune takes minutes on a fresh machine, and a call that runs out
# of time then still has the other two. `--cases` runs its cases in its own order.
cu = torch.tensor([0] + list(torch.tensor(PACKED).cumsum(0)), device=dev, dtype=torch.int32)
ALL = {
    "B2_T8192": lambda: case("B2_T8192", 2, 8192, 32, 128),
    "B2_T8192_gate": lambda: case("B2_T8192", 2, 8192, 32, 128, gate=True),
    "packed16_T16384": lambda: case("packed16_T16384", 1, sum(PACKED), 32, 128, cu.long()),
    "packed16_T16384_gate": lambda: case("packed16_T16384", 1, sum(PACKED), 32, 128, cu.long(),
                                         gate=True),
    "B1_T65536": lambda: case("B1_T65536", 1, 65536, 32, 128),
}
order = CASES or [n for n in ALL if n != "B1_T65536" or "--skip-long" not in sys.argv]
for n in order:
    if n not in ALL:
        sys.exit(f"kda_fla.py: unknown case {n!r} (known: {', '.join(ALL)})")
    ALL[n]()
