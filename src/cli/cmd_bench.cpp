#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "core/device.h"
#include "core/graph.h"
#include "core/rng.h"
#include "core/seq_info.h"
#include "model/mla_layer.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/expert_load.h"
#include "ops/gemm.h"
#include "ops/grouped_ffn.h"
#include "ops/grouped_matmul.h"
#include "ops/indexer.h"
#include "ops/kda.h"
#include "ops/kda_gate.h"
#include "ops/kda_prep_path.h"
#include "ops/moe_dispatch.h"
#include "ops/router.h"
#include "ops/sparse_mqa_attention.h"
#include "train/bench_decode.h"
#include "train/bench_step.h"
#include "train/files.h"

namespace mt::cli {

namespace {

// The DSA layer's kernels at the benchmark layer's shapes (issue 13): 32 heads with their own
// keys, q/k 192, v 128, indexer 8 x 64, top-2048, bf16, one document; bench/dsa_torch.py times
// the plain-PyTorch layer in the same parts.
struct DsaBenchOptions {
  std::string tokens = "8192,32768,65536,131072";
  int64_t heads = 32, qk_dim = 192, v_dim = 128, index_heads = 8, index_dim = 64, topk = 2048;
  int64_t kv_heads = 0;  // 0: one key head per query head (the engine's MLA layout)
  // MLA's latent and rotary widths: with kv_rank > 0 and per-head keys, attention runs as the DSA
  // layer runs it, in the absorbed MQA form (576-wide shared entries, 512-wide values, the
  // per-head W_UK / W_UV products included); 0: over the per-head keys.
  int64_t kv_rank = 512, rope_dim = 64;
  // The generation of the absorbed form's kernels the layer timings run (ops::SparseMqaKernels:
  // split, chained, wgmma, wgmma2 or wgmma3); the kernels' own fields time all of them either way.
  std::string mqa_kernels = "wgmma2";
  int64_t warmup = 1, iters = 3;
  double workspace_gib = 8;
};

// A device tensor of `s` in `dt` holding one block of 2^20 standard normal draws (times `scale`)
// over and over: speed does not depend on the values, and a 131072-token q stays cheap to fill.
Tensor random_device(const Shape& s, DType dt, Rng& rng, double scale = 1) {
  Tensor d = Tensor::empty(s, dt, Device::CUDA);
  const int64_t n = d.numel(), block = std::min<int64_t>(n, 1 << 20);
  Tensor h = Tensor::empty({block});
  for (int64_t i = 0; i < block; ++i) h.f32()[i] = static_cast<float>(scale * rng.normal());
  Tensor flat = d.view({n});
  for (int64_t b = 0; b < n; b += block) {
    const int64_t e = std::min(n, b + block);
    Tensor part = flat.rows(b, e);
    part.copy_from(h.rows(0, e - b));
  }
  return d;
}

// Mean wall milliseconds of `iters` runs of f after `warmup` untimed ones, the device drained
// before and after.
// `host_ms` (when given): the host's time per run to issue the work, before the wait for the
// device; near the mean the device waited on the host.
double mean_ms(Context& ctx, int64_t warmup, int64_t iters, const std::function<void()>& f,
               double* host_ms = nullptr) {
  using clock = std::chrono::steady_clock;
  for (int64_t i = 0; i < warmup; ++i) f();
  ctx.synchronize();
  const auto t0 = clock::now();
  for (int64_t i = 0; i < iters; ++i) f();
  const auto issued = clock::now();
  ctx.synchronize();
  const auto per_run = [&](clock::time_point t) {
    return 1e3 * std::chrono::duration<double>(t - t0).count() / static_cast<double>(iters);
  };
  if (host_ms) *host_ms = per_run(issued);
  return per_run(clock::now());
}

// A benchmark's device context: the GPU with `workspace_gib` of op scratch.
ContextOptions gpu_options(double workspace_gib) {
  return {.device = Device::CUDA,
          .workspace_bytes = static_cast<size_t>(workspace_gib * static_cast<double>(1 << 30))};
}

double used_gib() {
  const DeviceMemory m = device_memory();
  return static_cast<double>(m.total - m.free) / (1 << 30);
}

// Every generation of the absorbed form's kernels (ops::SparseMqaKernels), by name
// (sparse_mqa_kernels_name) for --mqa-kernels, and each timed by bench dsa.
constexpr ops::SparseMqaKernels kMqaKernels[] = {
    ops::SparseMqaKernels::Split, ops::SparseMqaKernels::Chained, ops::SparseMqaKernels::Wgmma,
    ops::SparseMqaKernels::Wgmma2, ops::SparseMqaKernels::Wgmma3};

nlohmann::json bench_dsa_at(const DsaBenchOptions& o, int64_t T) {
  nlohmann::json r = {{"T", T}};
  const double base = used_gib();
  Context ctx(gpu_options(o.workspace_gib));
  Rng rng(1);
  const int64_t H = o.heads, Hk = o.kv_heads ? o.kv_heads : o.heads, HI = o.index_heads,
                DI = o.index_dim, K = o.topk;
  const DType bf = DType::BF16;
  SeqInfo seq = SeqInfo::uniform(1, T);
  seq.cu_seqlens = seq.cu_seqlens.to(Device::CUDA);
  seq.positions = seq.positions.to(Device::CUDA);
  // The absorbed form (below) never forms per-head keys and values: only the per-head layout
  // allocates k, v and their gradients.
  const bool absorbed = o.kv_rank > 0 && Hk == H;
  const int64_t kv_tokens = absorbed ? 0 : T;
  Tensor q = random_device({T, H, o.qk_dim}, bf, rng),
         k = random_device({kv_tokens, Hk, o.qk_dim}, bf, rng),
         v = random_device({kv_tokens, Hk, o.v_dim}, bf, rng),
         dout = random_device({T, H, o.v_dim}, bf, rng);
  Tensor out_o = Tensor::empty({T, H, o.v_dim}, bf, Device::CUDA),
         lse = Tensor::empty({T, H}, DType::F32, Device::CUDA);
  Tensor dq = Tensor::empty(q.shape(), bf, Device::CUDA),
         dk = Tensor::empty(k.shape(), bf, Device::CUDA),
         dv = Tensor::empty(v.shape(), bf, Device::CUDA);
  Tensor qi = random_device({T, HI, DI}, bf, rng), ki = random_device({T, DI}, bf, rng),
         wi = random_device({T, HI}, bf, rng, 1 / std::sqrt(static_cast<double>(HI)));
  Tensor idx = Tensor::empty({T, K}, DType::I32, Device::CUDA);
  // The KL loss: the layer saves dscores; the target (and, off the fused kernel, the scores and
  // softmax) is its forward's workspace, as here (kl_fwd).
  Tensor dscores = Tensor::empty({T, K}, DType::F32, Device::CUDA),
         loss = Tensor::empty({1}, DType::F64, Device::CUDA);
  Tensor dqi = Tensor::empty(qi.shape(), bf, Device::CUDA),
         dki = Tensor::empty(ki.shape(), bf, Device::CUDA),
         dwi = Tensor::empty(wi.shape(), bf, Device::CUDA);
  r["allocated_gib"] = used_gib() - base;
  r["workspace_gib"] = o.workspace_gib;

  const ops::IndexerParams ip{.tokens = T, .heads = HI, .head_dim = DI};
  const ops::IndexerParams sp{.tokens = T, .heads = HI, .head_dim = DI, .kmax = K};
  const ops::AttentionParams ap{.tokens = T,
                                .heads = H,
                                .kv_heads = Hk,
                                .qk_dim = o.qk_dim,
                                .v_dim = o.v_dim,
                                .kmax = K,
                                .scale = 1.f / std::sqrt(static_cast<float>(o.qk_dim))};
  auto select = [&] { ops::indexer_causal_topk(ctx, ip, seq, qi, ki, wi, K, idx); };
  std::function<void()> attn_fwd = [&] {
    ops::attention_forward(ctx, ap, q, k, v, idx, out_o, lse);
  };
  // The attention backward; `target`, where defined, also gets the KL target (the absorbed
  // form only: the per-head backward has no such output).
  std::function<void(Tensor&)> attn_bwd_target = [&](Tensor&) {
    ops::attention_backward(ctx, ap, q, k, v, idx, out_o, lse, dout, dq, dk, dv);
  };
  // The absorbed form, as MlaLayer::absorbed_forward / absorbed_backward run it.
  const MlaAbsorbDims ad{.heads = H,
                         .nope = o.qk_dim - o.rope_dim,
                         .rope = o.rope_dim,
                         .v_dim = o.v_dim,
                         .kv_rank = o.kv_rank};
  const ops::SparseMqaParams mp{.tokens = T,
                                .heads = H,
                                .qk_dim = ad.latent(),
                                .v_dim = ad.kv_rank,
                                .kmax = K,
                                .scale = ap.scale};
  Tensor wkv, wgrad, qa, kvl, ol, dol, dqa, dkvl;
  if (absorbed) {
    MT_CHECK(ad.nope > 0, ValueError, "bench dsa: rope_dim ", o.rope_dim, " must be below qk_dim ",
             o.qk_dim);
    wkv = random_device({H * (ad.nope + o.v_dim), ad.kv_rank}, bf, rng, 0.05);
    wgrad = Tensor::zeros(wkv.shape(), DType::F32, Device::CUDA);
    kvl = random_device({T, ad.latent()}, bf, rng);
    for (Tensor* t : {&qa, &dqa}) *t = Tensor::empty({T, H, ad.latent()}, bf, Device::CUDA);
    for (Tensor* t : {&ol, &dol}) *t = Tensor::empty({T, H, ad.kv_rank}, bf, Device::CUDA);
    dkvl = Tensor::empty(kvl.shape(), bf, Device::CUDA);
    attn_fwd = [&] {
      mla_absorb_q(ctx, ad, wkv, q, qa);
      ops::sparse_mqa_forward(ctx, mp, qa, kvl, idx, ol, lse);
      mla_expand_o(ctx, ad, wkv, ol, out_o);
    };
    attn_bwd_target = [&](Tensor& target) {
      mla_absorb_q(ctx, ad, wkv, q, qa);  // rebuilt, not saved (MlaLayer::absorbed_backward)
      mla_expand_o_backward(ctx, ad, wkv, ol, dout, dol, wgrad);
      ops::sparse_mqa_backward(ctx, mp, qa, kvl, idx, ol, lse, dol, dqa, dkvl, target);
      mla_absorb_q_backward(ctx, ad, wkv, q, dqa, dq, wgrad);
    };
    r["allocated_gib"] = used_gib() - base;
  }
  auto attn_bwd = [&] {
    Tensor none;
    attn_bwd_target(none);
  };
  // A forward whose backward does not follow (DsaLayer::after_attention without
  // backward_follows: evaluation): the target's own pass in the workspace, then scores, loss and
  // the score gradient in one call.
  auto kl_fwd = [&] {
    ArenaScope scope(ctx.workspace());
    Tensor target = ctx.workspace().alloc({T, K}, DType::F32);
    if (absorbed)
      ops::sparse_mqa_prob_sum(ctx, mp, qa, kvl, idx, lse, target);
    else
      ops::attention_prob_sum(ctx, ap, q, k, idx, lse, target);
    ops::indexer_scores_kl(ctx, sp, qi, ki, wi, idx, target, 1.0, loss, dscores);
  };
  auto kl_bwd = [&] {
    ops::indexer_scores_backward(ctx, sp, qi, ki, wi, idx, dscores, dqi, dki, dwi);
  };
  // A training step's backward (DsaLayer::backward after a forward with backward_follows): the
  // attention backward writes the target on the absorbed path (the per-head one runs the prob sum
  // pass first), then the KL (scores, loss, score gradient) and the indexer's backward.
  auto layer_bwd = [&] {
    ArenaScope scope(ctx.workspace());
    Tensor target = ctx.workspace().alloc({T, K}, DType::F32), none;
    if (!absorbed) ops::attention_prob_sum(ctx, ap, q, k, idx, lse, target);
    attn_bwd_target(absorbed ? target : none);
    ops::indexer_scores_kl(ctx, sp, qi, ki, wi, idx, target, 1.0, loss, dscores);
    kl_bwd();
  };
  auto time = [&](const std::function<void()>& f) { return mean_ms(ctx, o.warmup, o.iters, f); };
  r["selection_path"] = ops::indexer_topk_fits(HI, DI) ? "fused" : "composite";
  // Heads whose q rows the fused kernel keeps in shared memory (fewer than index_heads: staged a
  // slice at a time per key tile).
  r["selection_resident_heads"] = ops::IndexerTopkTile::resident_heads(HI, DI);
  if (absorbed) {
    r["attention_path"] = ops::sparse_mqa_fits(H, mp.qk_dim, mp.v_dim) && !ctx.deterministic()
                              ? "absorbed mqa, tensor cores"
                              : "absorbed mqa, composite (direct kernels)";
    r["mqa_kernels"] = ops::sparse_mqa_kernels_name(ops::sparse_mqa_kernels());
  } else
    r["attention_path"] =
        ops::sparse_attention_fits(H, Hk, o.qk_dim, o.v_dim) ? "tensor cores" : "direct";
  r["indexer_selection_fwd_ms"] = time(select);
  r["attention_fwd_ms"] = time(attn_fwd);
  if (absorbed) {
    // What the absorbed kernels execute (one document: query t lists min(t + 1, K) keys), for
    // reading the forward time against the tensor cores' rate.
    const double keys =
        static_cast<double>(std::min(T, K)) * static_cast<double>(std::min(T, K) + 1) / 2 +
        static_cast<double>(std::max<int64_t>(T - K, 0)) * static_cast<double>(K);
    r["attention_fwd_tflops"] = 2.0 * static_cast<double>(H * (mp.qk_dim + mp.v_dim)) * keys /
                                (r["attention_fwd_ms"].get<double>() * 1e9);
  }
  r["attention_fwdbwd_ms"] = time([&] {
    attn_fwd();
    attn_bwd();
  });
  // The same with the KL target formed by the backward (absorbed form; the per-head backward
  // takes none, so there it equals attention_fwdbwd_ms): the difference is the target's cost.
  r["attention_fwdbwd_target_ms"] = time([&] {
    ArenaScope scope(ctx.workspace());
    Tensor target = ctx.workspace().alloc({T, K}, DType::F32), none;
    attn_fwd();
    attn_bwd_target(absorbed ? target : none);
  });
  if (absorbed) {
    // The sparse MQA kernels alone, each generation in the same run (ops::SparseMqaKernels): the
    // forward, and the backward writing the KL target as a training step runs it (its f32
    // key-gradient sum's zeroing and rounding to bf16 included); qa and dol as the parts above
    // left them. Wgmma's and Wgmma2's backward is Split's: their forward only; Wgmma3's forward
    // is Wgmma2's: its backward only (mqa_bwd_ms_wgmma3, the wgmma backward).
    const ops::SparseMqaKernels chosen = ops::sparse_mqa_kernels();
    for (const ops::SparseMqaKernels g : kMqaKernels) {
      ops::sparse_mqa_set_kernels(g);
      const std::string n = ops::sparse_mqa_kernels_name(g);
      ArenaScope scope(ctx.workspace());
      Tensor target = ctx.workspace().alloc({T, K}, DType::F32);
      if (g != ops::SparseMqaKernels::Wgmma3)
        r["mqa_fwd_ms_" + n] =
            time([&] { ops::sparse_mqa_forward(ctx, mp, qa, kvl, idx, ol, lse); });
      if (g == ops::SparseMqaKernels::Wgmma || g == ops::SparseMqaKernels::Wgmma2) continue;
      r["mqa_bwd_ms_" + n] = time([&] {
        ops::sparse_mqa_backward(ctx, mp, qa, kvl, idx, ol, lse, dol, dqa, dkvl, target);
      });
    }
    ops::sparse_mqa_set_kernels(chosen);
  }
  r["kl_fwd_ms"] = time(kl_fwd);
  r["kl_fwdbwd_ms"] = time([&] {
    kl_fwd();
    kl_bwd();
  });
  // The indexer's share of the KL path alone (the target, attention's prob sum, left out): its
  // scores with the loss and score gradient (one kernel on the fused path), and its backward
  // (dq / dw, the transposed index table, dk).
  {
    ArenaScope scope(ctx.workspace());
    Tensor target = ctx.workspace().alloc({T, K}, DType::F32);
    if (absorbed)
      ops::sparse_mqa_prob_sum(ctx, mp, qa, kvl, idx, lse, target);
    else
      ops::attention_prob_sum(ctx, ap, q, k, idx, lse, target);
    r["indexer_kl_ms"] =
        time([&] { ops::indexer_scores_kl(ctx, sp, qi, ki, wi, idx, target, 1.0, loss, dscores); });
  }
  r["indexer_bwd_ms"] = time(kl_bwd);
  // The layer as a training step runs it: the forward leaves the KL to backward.
  r["layer_fwd_ms"] = time([&] {
    select();
    attn_fwd();
  });
  r["layer_fwdbwd_ms"] = time([&] {
    select();
    attn_fwd();
    layer_bwd();
  });
  // An evaluation forward (no backward follows): the KL with its own target pass.
  r["layer_eval_fwd_ms"] = time([&] {
    select();
    attn_fwd();
    kl_fwd();
  });
  r["device_used_gib"] = used_gib() - base;
  // What the layer really holds at its peak: the tensors above (inputs, saved activations,
  // outputs and gradients, allocated outright) plus the workspace arena's high-water mark, not its
  // nominal size (workspace_gib, part of allocated_gib).
  const double gib = static_cast<double>(1 << 30);
  r["tensors_gib"] = r["allocated_gib"].get<double>() - o.workspace_gib;
  r["workspace_peak_gib"] = static_cast<double>(ctx.workspace().peak()) / gib;
  r["layer_peak_gib"] = r["tensors_gib"].get<double>() + r["workspace_peak_gib"].get<double>();
  r["kl_path"] = ops::indexer_scores_kl_fits(HI, DI, K) ? "fused" : "composite";
  return r;
}

// The KDA core (ops/kda.h, chunked, bf16 q/k/v/o, f32 gate and beta) at issue 12's shapes:
// B2 T8192 and B1 T65536 with H32 D128, and a packed case of 16 documents of mixed lengths
// summing to 16384 tokens; bench/kda_fla.py times fla's chunk_kda on the same shapes.
struct KdaBenchOptions {
  int64_t heads = 32, head_dim = 128, warmup = 2, iters = 10;
  // The backward's prepared blocks, Delta, dR and dS per chunk: 8.6 GB at B1 T65536 (the
  // prepared blocks are in the workspace unless kept from forward: kda_keep_prepared).
  double workspace_gib = 12;
  std::string prepared = "bf16";  // the tensor-core path's prepared layout (ops/kda_prep_path.h)
  std::string cases;              // comma-separated case names; empty: all
  bool no_overlap = false;        // prep, then the state pass, as the default (kda_forward_overlap)
};

// Captures `f` into g (core/graph.h); where capture fails, its reason goes to `error_key`.
bool capture_or_report(Context& ctx, const std::function<void()>& f, OpGraph& g,
                       const std::string& error_key, nlohmann::json& out) {
  try {
    g.capture(ctx, f);
  } catch (const Error& e) {
    out[error_key] = e.what();
    return false;
  }
  return true;
}

// The launches one call of `f` makes (kernel and memset nodes of its CUDA graph, captured and
// not run), or the capture's error under `key` + "_error".
void count_launches(Context& ctx, const std::function<void()>& f, const std::string& key,
                    nlohmann::json& out) {
  OpGraph g;
  if (!capture_or_report(ctx, f, g, key + "_error", out)) return;
  out[key] = g.nodes().kernels;
  out[key + "_memsets"] = g.nodes().memsets;
}

// `run()` with one of ops/kda_prep_path.h's switches set to `value` (then back as it was).
template <bool (*Get)(), void (*Set)(bool), typename F>
auto with_kda_switch(bool value, const F& run) {
  const ops::KdaSwitchScope<Get, Set> scope(value);
  return run();
}

nlohmann::json bench_kda_at(const KdaBenchOptions& o, const std::string& name,
                            const std::vector<int64_t>& lengths) {
  Context ctx(gpu_options(o.workspace_gib));
  Rng rng(1);
  SeqInfo seq = SeqInfo::from_lengths(lengths);
  const int64_t T = seq.tokens, H = o.heads, D = o.head_dim, N = seq.num_seqs;
  const ops::KdaParams p{.tokens = T, .heads = H, .head_k = D, .head_v = D, .num_seqs = N};
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  const Tensor cu = seq.cu_seqlens.to(Device::CUDA);
  const DType bf = DType::BF16, f32 = DType::F32;
  // Unit-norm q and k rows (the layer normalises them before the core), a mild decay, beta in
  // (0, 1): the values only have to keep the arithmetic finite.
  const double unit = 1 / std::sqrt(static_cast<double>(D));
  Tensor q = random_device({T, H, D}, bf, rng, unit), k = random_device({T, H, D}, bf, rng, unit),
         v = random_device({T, H, D}, bf, rng), dout = random_device({T, H, D}, bf, rng);
  const auto constant = [](const Shape& s, float value) {
    Tensor t = Tensor::empty(s);
    std::fill(t.f32(), t.f32() + t.numel(), value);
    return t.to(Device::CUDA);
  };
  Tensor g = constant({T, H, D}, -0.05f), beta = constant({T, H}, 0.5f);
  Tensor out = Tensor::empty({T, H, D}, bf, Device::CUDA), none;
  // What forward keeps for backward, as the KDA layer keeps it under the switches' current
  // settings (ops/kda_prep_path.h): the chunk states in kda_saved_dtype (bf16 by default), the
  // prepared blocks only under kda_keep_prepared (off by default: backward prepares again).
  const auto saved_for = [&] {
    return Tensor::empty({rows, H, D, D}, ops::kda_saved_dtype(Device::CUDA, p, bf), Device::CUDA);
  };
  const auto prepared_for = [&] {
    return ops::kda_keep_prepared()
               ? Tensor::empty({ops::kda_prepared_floats(p, rows, bf)}, f32, Device::CUDA)
               : Tensor();
  };
  Tensor saved = saved_for(), prepared = prepared_for();
  const double kept_gib = static_cast<double>(saved.bytes() + prepared.bytes()) / (1 << 30);
  Tensor dq = Tensor::empty(q.shape(), bf, Device::CUDA),
         dk = Tensor::empty(k.shape(), bf, Device::CUDA),
         dv = Tensor::empty(v.shape(), bf, Device::CUDA),
         dg = Tensor::empty(g.shape(), f32, Device::CUDA),
         dbeta = Tensor::empty(beta.shape(), f32, Device::CUDA);
  auto fwd = [&] {
    ops::kda_forward(ctx, p, cu, q, k, v, g, beta, Tensor(), out, none, saved, prepared);
  };
  auto bwd = [&] {
    ops::kda_backward(ctx, p, cu, q, k, v, g, beta, saved, prepared, dout, Tensor(), dq, dk, dv, dg,
                      dbeta, none);
  };
  auto time = [&](const std::function<void()>& f) { return mean_ms(ctx, o.warmup, o.iters, f); };
  // Backward alone cannot repeat: it overwrites the prepared block that it reads.
  const auto fwd_bwd = [&] {
    fwd();
    bwd();
  };
  const double f = time(fwd), fb = time(fwd_bwd);
  // The form before session 16 on the same inputs: the prepared blocks kept from forward to
  // backward (which then skips its prep) and fp32 chunk states.
  double f_keep = 0, fb_keep = 0, kept_gib_keep = 0;
  {
    const ops::KdaSwitchScope<ops::kda_keep_prepared, ops::kda_set_keep_prepared> keep(true);
    const ops::KdaSwitchScope<ops::kda_bf16_states, ops::kda_set_bf16_states> f32_states(false);
    Tensor s_keep = saved_for(), p_keep = prepared_for();
    std::swap(saved, s_keep);
    std::swap(prepared, p_keep);
    f_keep = time(fwd);
    fb_keep = time(fwd_bwd);
    kept_gib_keep = static_cast<double>(saved.bytes() + prepared.bytes()) / (1 << 30);
    std::swap(saved, s_keep);
    std::swap(prepared, p_keep);
  }
  // The default form with fp32 chunk states: what the bf16 states alone change.
  double fb_f32_states = 0;
  {
    const ops::KdaSwitchScope<ops::kda_bf16_states, ops::kda_set_bf16_states> f32_states(false);
    Tensor s_f32 = saved_for();
    std::swap(saved, s_f32);
    fb_f32_states = time(fwd_bwd);
    std::swap(saved, s_f32);
  }
  // An evaluation forward (no backward follows: nothing kept for it), as fla's chunk_kda under
  // torch.no_grad.
  ops::KdaParams pe = p;
  pe.keep_for_backward = false;
  const auto eval_fwd = [&] {
    ops::kda_forward(ctx, pe, cu, q, k, v, g, beta, Tensor(), out, none, saved, prepared);
  };
  const double fe = time(eval_fwd);
  // The same timings through the other kernel behind one of ops/kda_prep_path.h's switches (the
  // switch set for the run, then back as it was), so that old and new compare on the same machine
  // and inputs.
  const auto both_forwards = [&] { return std::pair(time(fwd), time(eval_fwd)); };
  const auto fwd_bwd_ms = [&] { return time(fwd_bwd); };
  const auto [f_v1, fe_v1] =
      with_kda_switch<ops::kda_forward_state_v2, ops::kda_set_forward_state_v2>(false,
                                                                                both_forwards);
  const auto [f_pv1, fe_pv1] =
      with_kda_switch<ops::kda_prep_v2, ops::kda_set_prep_v2>(false, both_forwards);
  // Prep, then the state pass, where the overlapped forward applies (one document of 32 heads).
  const auto [f_nov, fe_nov] =
      with_kda_switch<ops::kda_forward_overlap, ops::kda_set_forward_overlap>(false, both_forwards);
  // The forward state pass in the grid's order instead of the longest documents first.
  const auto [f_dord, fe_dord] =
      with_kda_switch<ops::kda_forward_longest_first, ops::kda_set_forward_longest_first>(
          false, both_forwards);
  // The overlap in waves where the state blocks do not fit beside the prep at once (off by
  // default).
  const auto [f_ovw, fe_ovw] =
      with_kda_switch<ops::kda_forward_overlap_waves, ops::kda_set_forward_overlap_waves>(
          true, both_forwards);
  const double fb_bv1 = with_kda_switch<ops::kda_backward_state_v2, ops::kda_set_backward_state_v2>(
      false, fwd_bwd_ms);
  const double fb_gv1 =
      with_kda_switch<ops::kda_grads_v2, ops::kda_set_grads_v2>(false, fwd_bwd_ms);
  const double fb_pv1 =
      with_kda_switch<ops::kda_products_v2, ops::kda_set_products_v2>(false, fwd_bwd_ms);
  // bwd_pre's work at the end of the backward's prep (kda_set_fused_delta, kda_set_fused_pre: by
  // default both jobs), or Delta alone there, or all of it by bwd_pre.
  const double fb_fused =
      with_kda_switch<ops::kda_fused_delta, ops::kda_set_fused_delta>(true, fwd_bwd_ms);
  const double fb_unfused =
      with_kda_switch<ops::kda_fused_delta, ops::kda_set_fused_delta>(false, fwd_bwd_ms);
  const double fb_delta_only =
      with_kda_switch<ops::kda_fused_pre, ops::kda_set_fused_pre>(false, fwd_bwd_ms);
  // Products v2 without its L2 prefetch.
  const double fb_pnp = with_kda_switch<ops::kda_products_prefetch, ops::kda_set_products_prefetch>(
      false, fwd_bwd_ms);
  // With the decay gate in front (ops/kda_gate.h, as the KDA layer runs it: raw in the
  // activations' type, g in f32), against fla's chunk_kda with use_gate_in_kernel.
  const ops::KdaGateParams gp{.tokens = T, .heads = H, .head_dim = D};
  Tensor raw = random_device({T, H * D}, bf, rng), a_log = random_device({H}, f32, rng, 0.5),
         dt_bias = random_device({H * D}, f32, rng, 0.1), gv = g.view({T, H * D});
  Tensor draw = Tensor::empty(raw.shape(), bf, Device::CUDA),
         da_log = Tensor::zeros(a_log.shape(), f32, Device::CUDA),
         ddt_bias = Tensor::zeros(dt_bias.shape(), f32, Device::CUDA);
  const auto gate_fwd = [&] {
    ops::kda_gate_forward(ctx, gp, raw, a_log, dt_bias, gv);
    fwd();
  };
  const double gf = time(gate_fwd),
               gfb = time([&] {
                 gate_fwd();
                 bwd();
                 ops::kda_gate_backward(ctx, gp, raw, a_log, dt_bias, dg.view({T, H * D}), draw,
                                        da_log, ddt_bias);
               });
  nlohmann::json r = {{"case", name},
                      {"tokens", T},
                      {"documents", N},
                      {"H", H},
                      {"D", D},
                      {"prep_path", ops::kda_prep_path_name(ops::kda_bf16_prep_path(p))},
                      {"prepared_layout", ops::kda_chunk_layout(p, bf).half ? "bf16" : "f32"},
                      {"saved_dtype", std::string(dtype_name(saved.dtype()))},
                      {"keeps_prepared", prepared.defined()},
                      {"fwd_ms", f},
                      {"fwdbwd_ms", fb},
                      {"fwd_ms_keep_prepared", f_keep},
                      {"fwdbwd_ms_keep_prepared", fb_keep},
                      {"saved_for_backward_gib_keep_prepared", kept_gib_keep},
                      {"fwdbwd_ms_f32_states", fb_f32_states},
                      {"fwd_eval_ms", fe},
                      {"fwd_ms_state_v1", f_v1},
                      {"fwd_eval_ms_state_v1", fe_v1},
                      {"fwd_ms_prep_v1", f_pv1},
                      {"fwd_eval_ms_prep_v1", fe_pv1},
                      {"fwd_ms_no_overlap", f_nov},
                      {"fwd_eval_ms_no_overlap", fe_nov},
                      {"fwd_ms_overlap_waves", f_ovw},
                      {"fwd_ms_doc_order", f_dord},
                      {"fwd_eval_ms_doc_order", fe_dord},
                      {"fwd_eval_ms_overlap_waves", fe_ovw},
                      {"fwdbwd_ms_bwd_state_v1", fb_bv1},
                      {"fwdbwd_ms_grads_v1", fb_gv1},
                      {"fwdbwd_ms_products_v1", fb_pv1},
                      {"fwdbwd_ms_products_v2_no_prefetch", fb_pnp},
                      {"fused_delta", ops::kda_fused_delta()},
                      {"fwdbwd_ms_fused_delta", fb_fused},
                      {"fwdbwd_ms_unfused_delta", fb_unfused},
                      {"fused_pre", ops::kda_fused_pre()},
                      {"fwdbwd_ms_fused_delta_only", fb_delta_only},
                      {"gate_core_fwd_ms", gf},
                      {"gate_core_fwdbwd_ms", gfb},
                      {"fwd_Mtok_s", T / f / 1e3},
                      {"fwdbwd_Mtok_s", T / fb / 1e3},
                      // Kept from forward for backward beside the inputs: the states at the
                      // documents' chunk boundaries (`saved`) and, where kept, the prepared
                      // blocks.
                      {"saved_for_backward_gib", kept_gib}};
  count_launches(ctx, fwd, "launches_fwd", r);
  count_launches(ctx, bwd, "launches_bwd", r);
  return r;
}

nlohmann::json run_kda_bench(const KdaBenchOptions& o, std::ostream& log) {
  // The packed case: 16 documents of mixed lengths (not multiples of the chunk), 16384 tokens in
  // all; bench/kda_fla.py lists the same.
  const std::vector<int64_t> packed = {100,  1500, 700,  2300, 64,   900, 1200, 333,
                                       1777, 450,  2048, 129,  1000, 640, 1111, 2132};
  const std::vector<std::pair<std::string, std::vector<int64_t>>> cases = {
      {"B2_T8192", {8192, 8192}}, {"B1_T65536", {65536}}, {"packed16_T16384", packed}};
  std::set<std::string> wanted;
  std::stringstream ss(o.cases);
  for (std::string item; std::getline(ss, item, ',');) {
    const bool known =
        std::any_of(cases.begin(), cases.end(), [&](const auto& c) { return c.first == item; });
    MT_CHECK(known, ValueError, "bench kda: --cases has \"", item,
             "\"; the cases are B2_T8192, B1_T65536 and packed16_T16384");
    wanted.insert(item);
  }
  MT_CHECK(o.prepared == "bf16" || o.prepared == "f32", ValueError,
           "bench kda: --prepared is bf16 or f32, not ", o.prepared);
  MT_CHECK(cuda_available(), ValueError, "bench kda: needs a GPU (and a binary built with CUDA)");
  nlohmann::json j = {{"device", cuda_device_name(0)}, {"runs", nlohmann::json::array()}};
  // Set for the runs, put back as they were however the runs end.
  const ops::KdaSwitchScope<ops::kda_bf16_prepared, ops::kda_set_bf16_prepared> prepared(
      o.prepared == "bf16");
  const ops::KdaSwitchScope<ops::kda_forward_overlap, ops::kda_set_forward_overlap> overlap(
      !o.no_overlap);
  for (const auto& [name, lengths] : cases) {
    if (!wanted.empty() && !wanted.count(name)) continue;
    log << "bench kda: " << name << "\n";
    j["runs"].push_back(bench_kda_at(o, name, lengths));
    log << j["runs"].back().dump() << "\n";
  }
  return j;
}

// The routed experts' grouped SwiGLU FFN (ops/grouped_ffn.h, bf16) at issue 14's shapes: A =
// 16384 tokens x top-8 over 64 experts, d 2048, ffn 1024; B = 8192 x top-8 over 256 experts, d
// 2304, ffn 1024; near-uniform routing and skewed routing (every eighth expert hot, 30x the rows
// of the others). Forward, forward+backward with a frozen base (dX only), with the base training
// (dX + dW) and with LoRA on every expert projection (dX + the adapters' grads);
// bench/moe_torch.py times torch._grouped_mm on the same shapes and row counts. Beside them: the
// frozen and LoRA forward+backward replayed from a CUDA graph, and the MoE layer's routing,
// permutation and combine (bench_routing), each part and its share (docs/cli.md, bench moe).
struct MoeBenchOptions {
  int64_t lora_rank = 16, warmup = 2, iters = 10;
  double workspace_gib = 4;
  // Grouped GEMM configurations to run in turn (ops/grouped_matmul.h names, comma-separated);
  // empty: MOETRAIN_GROUPED_GEMM's, or the default.
  std::string gemm;
  // Cases to run, comma-separated ("A", "B:skewed", ...: a shape, optionally its routing); empty:
  // all four. A profiler run (ncu) wants one.
  std::string cases;
  // The base runs only (forward, frozen, full, full with dW written): no LoRA, graphs or routing,
  // so that a sweep of grouped GEMM configurations spends its device time on what they change.
  bool base_only = false;
  // The K-concatenated LoRA run's kernels (GroupedFfnParams::lora_fwd / lora_bwd / lora_out_grads /
  // lora_xa / lora_dr: separate, staged or registers, and gemm for xa and dr; empty: the op's
  // defaults), and the other kernels timed beside it, as "fwd=<kernels>", "bwd=...", "og=...",
  // "xa=..." or "dr=...", comma-separated: "all" (every other one) or "none".
  std::string lora_fwd, lora_bwd, lora_og, lora_xa, lora_dr, lora_variants = "all";
};

ops::LoraKernels parse_lora_kernels(const std::string& s) {
  if (s == "separate") return ops::LoraKernels::Separate;
  if (s == "staged") return ops::LoraKernels::Staged;
  if (s == "gemm") return ops::LoraKernels::Gemm;
  MT_CHECK(
      s == "registers", ValueError,
      "bench moe: LoRA kernels are separate, staged, registers or gemm (xa and dr only), got \"", s,
      "\"");
  return ops::LoraKernels::Registers;
}

const char* lora_kernels_name(ops::LoraKernels k) {
  return k == ops::LoraKernels::Separate    ? "separate"
         : k == ops::LoraKernels::Staged    ? "staged"
         : k == ops::LoraKernels::Registers ? "registers"
                                            : "gemm";
}

// Whether `cases` (MoeBenchOptions::cases) selects shape `name` with this routing.
bool moe_case_selected(const std::string& cases, const std::string& name, bool skewed) {
  if (cases.empty()) return true;
  std::stringstream ss(cases);
  for (std::string c; std::getline(ss, c, ',');) {
    const std::string routing = skewed ? "skewed" : "uniform";
    if (c == name || c == name + ":" + routing) return true;
  }
  return false;
}

// Rows per expert summing to `rows`: equal, or every eighth expert `hot` times the others.
std::vector<int32_t> expert_offsets(int64_t rows, int64_t experts, bool skewed) {
  const int64_t hot = 30;
  const auto weight = [&](size_t e) { return skewed && e % 8 == 0 ? hot : int64_t{1}; };
  const size_t n = static_cast<size_t>(experts);
  int64_t total = 0;
  for (size_t e = 0; e < n; ++e) total += weight(e);
  std::vector<int32_t> off(n + 1, 0);
  int64_t given = 0;
  for (size_t e = 0; e < n; ++e) {
    const int64_t share = rows * weight(e) / total;
    off[e + 1] = static_cast<int32_t>(off[e] + share);
    given += share;
  }
  // The remainder, one row each to the first experts.
  for (size_t e = 0; given < rows; ++e, ++given)
    for (size_t f = e + 1; f <= n; ++f) ++off[f];
  return off;
}

// The MoE layer's routing around the grouped experts, timed per part on the same ops in the same
// order as MoeLayer::forward / backward (model/moe_layer.cpp; no latent projection, as at the
// bench shapes, and no shared experts): forward the router GEMM (bf16 tokens x gate -> f32
// logits), the router (sigmoid scores, top-k on score + correction bias, renormalised weights
// times Kimi-Linear's routed scaling 2.446, one group as Kimi's configs have it) with the aux
// statistics the layer always computes (seq aux loss, z-loss), the dispatch plan (CUB's sort,
// offsets, the expert load count and the offsets' copy to the host: the layer's one wait), the
// gather of token rows into expert order and the weighted combine; backward the combine's
// (row gradients and weight gradients), the gather's, the router's (with the seq aux loss's
// gradient at the seed config's coefficient; the z-loss's is off there) and the router GEMM's
// two (dlogits narrowed to bf16, then the gate's gradient and dX). The routing is the router's
// own choice on random tokens (N(0, 1), gate N(0, 1/d): near-uniform), one document; the
// grouped FFN beside it runs the case's synthetic offsets.
nlohmann::json bench_routing(Context& ctx, int64_t T, int64_t K, int64_t E, int64_t d,
                             const std::function<double(const std::function<void()>&)>& time) {
  Rng rng(2);
  const DType bf = DType::BF16, f32 = DType::F32, i32 = DType::I32;
  const Device D = Device::CUDA;
  const int64_t N = T * K;
  const float seq_aux_coeff = 1e-4f;  // configs/seed-2.8t.json's router_aux_loss_coef
  const ops::RouterParams rp{.tokens = T,
                             .experts = E,
                             .top_k = K,
                             .score = ops::ScoreFunc::Sigmoid,
                             .n_group = 1,
                             .topk_group = 1,
                             .norm_topk_prob = true,
                             .routed_scaling = 2.446f};
  const SeqInfo seq = SeqInfo::uniform(1, T);  // the aux statistics read its host offsets
  const Tensor x = random_device({T, d}, bf, rng),
               gate = random_device({E, d}, bf, rng, 1 / std::sqrt(static_cast<double>(d))),
               bias = random_device({E}, f32, rng, 0.01);
  Tensor logits = Tensor::empty({T, E}, f32, D), scores = Tensor::empty({T, E}, f32, D),
         ids = Tensor::empty({T, K}, i32, D), weights = Tensor::empty({T, K}, f32, D),
         aux = Tensor::empty({1}, DType::F64, D), zloss = Tensor::empty({1}, DType::F64, D);
  Tensor perm = Tensor::empty({N}, i32, D), inv = Tensor::empty({N}, i32, D),
         offsets = Tensor::empty({E + 1}, i32, D), offsets_host = Tensor::empty({E + 1}, i32),
         load = Tensor::zeros({E}, DType::I64, D);
  // Expert outputs and row gradients: random stand-ins for what the grouped FFN would write.
  const Tensor rows_out = random_device({N, d}, bf, rng), drows = random_device({N, d}, bf, rng),
               dy = random_device({T, d}, bf, rng);
  Tensor rows = Tensor::empty({N, d}, bf, D), y = Tensor::empty({T, d}, bf, D),
         drows_out = Tensor::empty({N, d}, bf, D), dweights = Tensor::empty({T, K}, f32, D),
         dx = Tensor::empty({T, d}, bf, D), dlogits = Tensor::empty({T, E}, f32, D),
         dl = Tensor::empty({T, E}, bf, D), dgate = Tensor::zeros({E, d}, f32, D);
  nlohmann::json r;
  // In the layer's order, so each part reads what the one before wrote (warm-up included).
  const double gemm_f = time([&] { ops::matmul(ctx, x, false, gate, true, logits); });
  const double router_f = time([&] {
    ops::router_forward(ctx, rp, logits, bias, scores, ids, weights);
    ops::router_seq_aux_loss(ctx, rp, seq, scores, ids, aux);
    ops::router_z_loss(ctx, rp, logits, zloss);
  });
  const double plan = time([&] {
    ops::moe_dispatch_plan(ctx, ids, E, perm, inv, offsets);
    ops::expert_load_count(ctx, offsets, Tensor(), load);
    offsets_host.copy_from(offsets);
  });
  const double gather = time([&] { ops::moe_gather(ctx, x, perm, K, rows); });
  const double combine_f = time([&] { ops::moe_combine(ctx, rows_out, weights, inv, y); });
  const double combine_b = time(
      [&] { ops::moe_combine_backward(ctx, rows_out, weights, inv, dy, drows_out, dweights); });
  const double gather_b = time([&] { ops::moe_gather_backward(ctx, drows, inv, K, dx); });
  const double router_b = time([&] {
    ops::router_backward(ctx, rp, scores, ids, dweights, dlogits);
    ops::router_seq_aux_backward(ctx, rp, seq, scores, ids, seq_aux_coeff, dlogits);
  });
  const double gemm_b = time([&] {
    ops::copy(ctx, dlogits, dl);
    ops::matmul(ctx, dl, true, x, false, dgate, 1.f, 1.f);
    ops::matmul(ctx, dl, false, gate, false, dx, 1.f, 1.f);
  });
  int32_t most = 0;
  for (int64_t e = 0; e < E; ++e)
    most = std::max(most, offsets_host.i32()[e + 1] - offsets_host.i32()[e]);
  r["routing_max_rows_per_expert"] = most;
  r["router_gemm_fwd_ms"] = gemm_f;
  r["router_fwd_ms"] = router_f;
  r["dispatch_plan_ms"] = plan;
  r["gather_ms"] = gather;
  r["combine_fwd_ms"] = combine_f;
  r["routing_total_fwd_ms"] = gemm_f + router_f + plan + gather + combine_f;
  r["combine_bwd_ms"] = combine_b;
  r["gather_bwd_ms"] = gather_b;
  r["router_bwd_ms"] = router_b;
  r["router_gemm_bwd_ms"] = gemm_b;
  r["routing_total_bwd_ms"] = combine_b + gather_b + router_b + gemm_b;
  return r;
}

// A CUDA graph of `f` (core/graph.h) replayed `iters` times: its mean time under `key` and the
// launches one call makes under `launches_key` (the graph's kernel nodes; memsets under
// `launches_key` + "_memsets"), or, where capture fails, the reason under `key` + "_error".
void time_graph(Context& ctx, const MoeBenchOptions& o, const std::function<void()>& f,
                const std::string& key, const std::string& launches_key, nlohmann::json& out) {
  OpGraph g;
  if (!capture_or_report(ctx, f, g, key + "_error", out)) return;
  out[key] = mean_ms(ctx, o.warmup, o.iters, [&] { g.replay(ctx); });
  out[launches_key] = g.nodes().kernels;
  out[launches_key + "_memsets"] = g.nodes().memsets;
}

// Alternating frozen / LoRA rounds behind lora_overhead_fwdbwd_median.
constexpr int kMoeRounds = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

nlohmann::json bench_moe_at(const MoeBenchOptions& o, const ops::GroupedGemmConfig& gemm,
                            const std::string& name, int64_t tokens, int64_t topk, int64_t E,
                            int64_t d, int64_t F, bool skewed) {
  Context ctx(gpu_options(o.workspace_gib));
  Rng rng(1);
  const DType bf = DType::BF16, f32 = DType::F32;
  const Device D = Device::CUDA;
  const int64_t rows = tokens * topk, r = o.lora_rank;
  const std::vector<int32_t> off = expert_offsets(rows, E, skewed);
  Tensor offsets = Tensor::empty({E + 1}, DType::I32);
  std::copy(off.begin(), off.end(), offsets.i32());  // host: the grouped ops read them there
  const double sd = 1 / std::sqrt(static_cast<double>(d)),
               sf = 1 / std::sqrt(static_cast<double>(F));
  Tensor x = random_device({rows, d}, bf, rng), dy = random_device({rows, d}, bf, rng);
  Tensor y = Tensor::empty({rows, d}, bf, D), dx = Tensor::empty({rows, d}, bf, D);
  ops::GroupedFfnWeights w{.gate_up = random_device({E, 2 * F, d}, bf, rng, sd),
                           .down = random_device({E, d, F}, bf, rng, sf)};
  ops::GroupedFfnWeights lw = w;
  lw.gate_up_a = random_device({E, r, d}, bf, rng, sd);
  lw.gate_up_b = random_device({E, 2 * F, r}, bf, rng, 0.01);
  lw.down_a = random_device({E, r, F}, bf, rng, sf);
  lw.down_b = random_device({E, d, r}, bf, rng, 0.01);
  const ops::GroupedFfnParams p{.rows = rows, .experts = E, .in = d, .ffn = F, .gemm = gemm};
  ops::GroupedFfnParams lp = p;
  lp.lora_rank = r;
  lp.lora_alpha = static_cast<float>(2 * r);
  ArenaPlan plan(bf, D), lplan(bf, D);
  ops::grouped_ffn_plan(p, plan);
  ops::grouped_ffn_plan(lp, lplan);
  Arena arena(plan.bytes(), D, "bench moe saved"), larena(lplan.bytes(), D, "bench moe saved");
  ops::GroupedFfnSaved saved = ops::grouped_ffn_alloc_saved(p, arena, bf);
  ops::GroupedFfnSaved lsaved = ops::grouped_ffn_alloc_saved(lp, larena, bf);
  // Expert LoRA K-concatenated where it applies (ops/grouped_ffn.h), as the MoE layer runs it:
  // the base weights in their padded buffers (copies here, so that the frozen runs and the
  // separate passes timed beside it keep theirs) and rows with r spare columns.
  const bool kconcat = ops::grouped_ffn_kconcat(lp, D, bf);
  ops::GroupedFfnWeights kw = lw;
  ops::GroupedFfnParams kp = lp;
  if (!o.lora_fwd.empty()) kp.lora_fwd = parse_lora_kernels(o.lora_fwd);
  if (!o.lora_bwd.empty()) kp.lora_bwd = parse_lora_kernels(o.lora_bwd);
  if (!o.lora_og.empty()) kp.lora_out_grads = parse_lora_kernels(o.lora_og);
  if (!o.lora_xa.empty()) kp.lora_xa = parse_lora_kernels(o.lora_xa);
  if (!o.lora_dr.empty()) kp.lora_dr = parse_lora_kernels(o.lora_dr);
  Tensor kx = x, kdy = dy;
  if (kconcat) {
    kw.gate_up = ops::grouped_ffn_pad_weight(w.gate_up, r);
    kw.down = ops::grouped_ffn_pad_weight(w.down, r);
    kp.padded_rows = true;
    kx = Tensor::empty({rows, ops::grouped_ffn_rows_pitch(kp)}, bf, D).cols(0, d);
    kx.copy_from(x);
    kdy = Tensor::empty({rows, ops::grouped_ffn_rows_pitch(kp)}, bf, D).cols(0, d);
    kdy.copy_from(dy);
  }
  // Gradients are fp32 (as the parameter store keeps them); frozen members stay undefined.
  ops::GroupedFfnWeights frozen, full{.gate_up = Tensor::zeros({E, 2 * F, d}, f32, D),
                                      .down = Tensor::zeros({E, d, F}, f32, D)};
  ops::GroupedFfnWeights lora{.gate_up_a = Tensor::zeros({E, r, d}, f32, D),
                              .gate_up_b = Tensor::zeros({E, 2 * F, r}, f32, D),
                              .down_a = Tensor::zeros({E, r, F}, f32, D),
                              .down_b = Tensor::zeros({E, d, r}, f32, D)};
  auto time = [&](const std::function<void()>& f) { return mean_ms(ctx, o.warmup, o.iters, f); };
  auto fwd = [&] { ops::grouped_ffn_forward(ctx, p, x, offsets, w, y, saved); };
  auto lfwd = [&] { ops::grouped_ffn_forward(ctx, kp, kx, offsets, kw, y, lsaved); };
  auto lbwd = [&] { ops::grouped_ffn_backward(ctx, kp, kx, offsets, kw, lsaved, kdy, dx, lora); };
  auto sfwd = [&] { ops::grouped_ffn_forward(ctx, lp, x, offsets, lw, y, lsaved); };
  auto bwd = [&](ops::GroupedFfnWeights& g) {
    ops::grouped_ffn_backward(ctx, p, x, offsets, w, saved, dy, dx, g);
  };
  // FLOPs as ../shared/bench/anchors_torch.py counts them: the up (2F) and down (F) projections
  // forward, twice that again for dX and for dW.
  const double flops =
      2.0 * static_cast<double>(rows) * static_cast<double>(d) * 3.0 * static_cast<double>(F);
  const double f = time(fwd);
  const auto frozen_fb = [&] {
    fwd();
    bwd(frozen);
  };
  double fb_frozen_host = 0, fb_written_host = 0;
  const double fb_frozen = mean_ms(ctx, o.warmup, o.iters, frozen_fb, &fb_frozen_host);
  const double fb_full = time([&] {
    fwd();
    bwd(full);
  });
  // The same where the gradients are known to hold zeros (a step's first backward since
  // zero_grad, as the MoE layer runs it): dW written, its f32 buffers never read.
  ops::GroupedFfnParams pz = p;
  pz.weight_grads_zero = true;
  const double fb_full_written = mean_ms(
      ctx, o.warmup, o.iters,
      [&] {
        fwd();
        ops::grouped_ffn_backward(ctx, pz, x, offsets, w, saved, dy, dx, full);
      },
      &fb_written_host);
  // The same with h kept from forward (GroupedFfnParams::keep_h): SwiGLU's backward writes no h.
  ops::GroupedFfnParams ph = pz;
  ph.keep_h = true;
  ArenaPlan hplan(bf, D);
  ops::grouped_ffn_plan(ph, hplan);
  Arena harena(hplan.bytes(), D, "bench moe saved");
  ops::GroupedFfnSaved hsaved = ops::grouped_ffn_alloc_saved(ph, harena, bf);
  const auto full_keep_h = [&] {
    ops::grouped_ffn_forward(ctx, ph, x, offsets, w, y, hsaved);
    ops::grouped_ffn_backward(ctx, ph, x, offsets, w, hsaved, dy, dx, full);
  };
  const double fb_full_keep_h = time(full_keep_h);
  const auto tf = [&](double mult, double ms) { return mult * flops / ms / 1e9; };
  int32_t most = 0;
  for (size_t e = 0; e + 1 < off.size(); ++e) most = std::max(most, off[e + 1] - off[e]);
  nlohmann::json run = {{"case", name},
                        {"grouped_gemm", ops::grouped_gemm_config_name(gemm)},
                        {"routing", skewed ? "skewed" : "uniform"},
                        {"tokens", tokens},
                        {"topk", topk},
                        {"experts", E},
                        {"d", d},
                        {"ffn", F},
                        {"max_rows_per_expert", most},
                        {"fwd_ms", f},
                        {"fwd_tflops", tf(1, f)},
                        {"fwdbwd_frozen_ms", fb_frozen},
                        {"fwdbwd_frozen_host_ms", fb_frozen_host},
                        {"fwdbwd_full_written_host_ms", fb_written_host},
                        {"fwdbwd_frozen_tflops", tf(2, fb_frozen)},
                        {"fwdbwd_full_ms", fb_full},
                        {"fwdbwd_full_tflops", tf(3, fb_full)},
                        {"fwdbwd_full_written_ms", fb_full_written},
                        {"fwdbwd_full_written_tflops", tf(3, fb_full_written)},
                        {"fwdbwd_full_written_keep_h_ms", fb_full_keep_h},
                        {"fwdbwd_full_written_keep_h_tflops", tf(3, fb_full_keep_h)}};
  // The interleaved gate/up layout (GroupedFfnParams::interleaved_gate_up; the same weights
  // permuted once): SwiGLU in the gate/up GEMM's epilogue. Forward, frozen and full (dW written, h
  // kept as that forward writes it anyway) forward+backward, each in alternating rounds with the
  // default layout's run (the median of the rounds' ratios: the clocks drift within a call).
  const bool interleave = F % ops::kGateUpInterleave == 0;
  ops::GroupedFfnWeights iw = w;  // w's gate_up interleaved
  ops::GroupedFfnParams ip = p;
  ip.interleaved_gate_up = true;
  if (interleave) {
    iw.gate_up = Tensor::empty(w.gate_up.shape(), bf, D);
    ops::grouped_ffn_interleave_gate_up(ctx, w.gate_up, iw.gate_up);
  }
  const auto ifrozen = [&] {
    ops::grouped_ffn_forward(ctx, ip, x, offsets, iw, y, saved);
    ops::grouped_ffn_backward(ctx, ip, x, offsets, iw, saved, dy, dx, frozen);
  };
  if (interleave) {
    ops::GroupedFfnParams iph = ph;
    iph.interleaved_gate_up = true;
    const auto ifwd = [&] { ops::grouped_ffn_forward(ctx, ip, x, offsets, iw, y, saved); };
    const auto ifull = [&] {
      ops::grouped_ffn_forward(ctx, iph, x, offsets, iw, y, hsaved);
      ops::grouped_ffn_backward(ctx, iph, x, offsets, iw, hsaved, dy, dx, full);
    };
    const auto versus = [&](const char* key, const std::function<void()>& base,
                            const std::function<void()>& inter) {
      std::vector<double> ratios, inter_ms;
      for (int round = 0; round < kMoeRounds; ++round) {
        const double b = time(base);
        inter_ms.push_back(time(inter));
        ratios.push_back(inter_ms.back() / b);
      }
      run[std::string(key) + "_interleaved_ms"] = median(inter_ms);
      run[std::string(key) + "_interleaved_vs_default_median"] = median(ratios);
    };
    versus("fwd", fwd, ifwd);
    versus("fwdbwd_frozen", frozen_fb, ifrozen);
    versus("fwdbwd_full_written_keep_h", full_keep_h, ifull);
  }
  if (o.base_only) return run;
  const double lf = time(lfwd);
  double lfb_host = 0;
  const auto lora_fb = [&] {
    lfwd();
    lbwd();
  };
  const double lfb = mean_ms(ctx, o.warmup, o.iters, lora_fb, &lfb_host);
  run["lora_rank"] = r;
  run["lora_fwd_ms"] = lf;
  run["lora_fwdbwd_ms"] = lfb;
  run["lora_fwdbwd_host_ms"] = lfb_host;
  run["lora_overhead_fwdbwd"] = lfb / fb_frozen - 1;
  // The same overhead from alternating rounds of the two (frozen, then LoRA, `iters` runs each),
  // the median of the rounds' ratios: the device's clocks drift within a call (A's frozen run
  // swung between 5.1 and 5.9 ms in one run, sessions 15-17, its kernels summing to 5.1 ms at the
  // clocks ncu saw), and the two runs of a round share the conditions.
  std::vector<double> ratios, frozen_rounds, lora_rounds;
  for (int round = 0; round < kMoeRounds; ++round) {
    frozen_rounds.push_back(time(frozen_fb));
    lora_rounds.push_back(time(lora_fb));
    ratios.push_back(lora_rounds.back() / frozen_rounds.back());
  }
  run["fwdbwd_frozen_rounds_ms"] = frozen_rounds;
  run["lora_fwdbwd_rounds_ms"] = lora_rounds;
  run["lora_overhead_fwdbwd_median"] = median(ratios) - 1;
  run["lora_path"] = kconcat ? "kconcat" : "separate";
  // The same with the interleaved layout (B_gu's rows read as interleaved: a timing): its overhead
  // over the interleaved frozen run, and its time against the default layout's LoRA run, each the
  // median of alternating rounds.
  if (interleave) {
    ops::GroupedFfnParams ikp = kp;
    ikp.interleaved_gate_up = true;
    ops::GroupedFfnWeights ikw = kw;
    ikw.gate_up = kconcat ? ops::grouped_ffn_pad_weight(iw.gate_up, r) : iw.gate_up;
    const auto ilora = [&] {
      ops::grouped_ffn_forward(ctx, ikp, kx, offsets, ikw, y, lsaved);
      ops::grouped_ffn_backward(ctx, ikp, kx, offsets, ikw, lsaved, kdy, dx, lora);
    };
    std::vector<double> over, vs_default;
    for (int round = 0; round < kMoeRounds; ++round) {
      const double fz = time(ifrozen), lo = time(ilora), dl = time(lora_fb);
      over.push_back(lo / fz);
      vs_default.push_back(lo / dl);
    }
    run["lora_overhead_fwdbwd_interleaved_median"] = median(over) - 1;
    run["lora_fwdbwd_interleaved_vs_default_median"] = median(vs_default);
  }
  run["lora_fwd_kernels"] = lora_kernels_name(kp.lora_fwd);
  run["lora_bwd_kernels"] = lora_kernels_name(kp.lora_bwd);
  run["lora_out_grads_kernels"] = lora_kernels_name(kp.lora_out_grads);
  run["lora_xa_kernels"] = lora_kernels_name(kp.lora_xa);
  run["lora_dr_kernels"] = lora_kernels_name(kp.lora_dr);
  if (kconcat) {  // session 13's kernels on the same path (GroupedFfnParams::lora_s13_kernels)
    ops::GroupedFfnParams kp13 = kp;
    kp13.lora_s13_kernels = true;
    const double s13_fb = time([&] {
      ops::grouped_ffn_forward(ctx, kp13, kx, offsets, kw, y, lsaved);
      ops::grouped_ffn_backward(ctx, kp13, kx, offsets, kw, lsaved, kdy, dx, lora);
    });
    run["lora_s13_fwdbwd_ms"] = s13_fb;
    run["lora_s13_overhead_fwdbwd"] = s13_fb / fb_frozen - 1;
    // Each pass's other kernels (GroupedFfnParams::lora_fwd / lora_bwd / lora_out_grads) against
    // the run above, one pass at a time (MoeBenchOptions::lora_variants): lora_<pass>_<kernels>_
    // fwd_ms, _fwdbwd_ms, _overhead_fwdbwd.
    using K = ops::LoraKernels;
    for (const char* pass : {"fwd", "bwd", "og", "xa", "dr"})
      for (const K k : {K::Separate, K::Staged, K::Registers, K::Gemm}) {
        ops::GroupedFfnParams kv = kp;
        const std::string ps = pass;
        K& field = ps == "fwd"   ? kv.lora_fwd
                   : ps == "bwd" ? kv.lora_bwd
                   : ps == "og"  ? kv.lora_out_grads
                   : ps == "xa"  ? kv.lora_xa
                                 : kv.lora_dr;
        const std::string v = ps + "=" + lora_kernels_name(k);
        // xa has no separate form (it is one product); only xa runs inside a GEMM; dr is the GEMM
        // or not (Staged: lora_out_grads's kernels, then the GEMM).
        const bool offered = ps == "xa"   ? k != K::Separate
                             : ps == "dr" ? k == K::Gemm || k == K::Staged
                                          : k != K::Gemm;
        if (k == field || !offered || o.lora_variants == "none" ||
            (o.lora_variants != "all" &&
             ("," + o.lora_variants + ",").find("," + v + ",") == std::string::npos))
          continue;
        field = k;
        const std::string key = "lora_" + ps + "_" + lora_kernels_name(k);
        const auto vf = [&] { ops::grouped_ffn_forward(ctx, kv, kx, offsets, kw, y, lsaved); };
        const double v_f = time(vf);
        const double v_fb = time([&] {
          vf();
          ops::grouped_ffn_backward(ctx, kv, kx, offsets, kw, lsaved, kdy, dx, lora);
        });
        run[key + "_fwd_ms"] = v_f;
        run[key + "_fwdbwd_ms"] = v_fb;
        run[key + "_overhead_fwdbwd"] = v_fb / fb_frozen - 1;
      }
  }
  if (kconcat) {  // the separate passes on the same shapes, for the comparison
    const double sep_f = time(sfwd);
    const double sep_fb = time([&] {
      sfwd();
      ops::grouped_ffn_backward(ctx, lp, x, offsets, lw, lsaved, dy, dx, lora);
    });
    run["lora_separate_fwd_ms"] = sep_f;
    run["lora_separate_fwdbwd_ms"] = sep_fb;
    run["lora_separate_overhead_fwdbwd"] = sep_fb / fb_frozen - 1;
  }
  // The same forward+backward replayed from a CUDA graph: the offsets are fixed here, so the
  // problem sizes the grouped GEMMs take from their host copy hold at every replay.
  time_graph(ctx, o, frozen_fb, "graph_fwdbwd_frozen_ms", "fwdbwd_frozen_launches", run);
  time_graph(ctx, o, lora_fb, "graph_lora_fwdbwd_ms", "lora_fwdbwd_launches", run);
  if (run.contains("graph_fwdbwd_frozen_ms"))
    run["graph_saving_fwdbwd_frozen"] = 1 - run["graph_fwdbwd_frozen_ms"].get<double>() / fb_frozen;
  if (run.contains("graph_lora_fwdbwd_ms"))
    run["graph_saving_lora_fwdbwd"] = 1 - run["graph_lora_fwdbwd_ms"].get<double>() / lfb;
  // Routing, permutation and combine beside the grouped FFN, and their share of the two. A
  // failure there (memory) leaves its reason and keeps the expert timings above.
  try {
    run.update(bench_routing(ctx, tokens, topk, E, d, time));
  } catch (const Error& e) {
    run["routing_error"] = e.what();
    return run;
  }
  const double rf = run["routing_total_fwd_ms"].get<double>(),
               rfb = rf + run["routing_total_bwd_ms"].get<double>();
  run["routing_share_fwd"] = rf / (rf + f);
  run["routing_share_fwdbwd_frozen"] = rfb / (rfb + fb_frozen);
  run["routing_share_lora_fwdbwd"] = rfb / (rfb + lfb);
  return run;
}

nlohmann::json run_moe_bench(const MoeBenchOptions& o, std::ostream& log) {
  MT_CHECK(cuda_available(), ValueError, "bench moe: needs a GPU (and a binary built with CUDA)");
  // The grouped GEMM configurations to compare, each run over every shape.
  std::vector<ops::GroupedGemmConfig> gemms;
  std::stringstream names(o.gemm);
  for (std::string n; std::getline(names, n, ',');)
    gemms.push_back(ops::parse_grouped_gemm_config(n));
  if (gemms.empty()) gemms.push_back(ops::grouped_gemm_config_from_env());
  if (!o.cases.empty()) {
    std::stringstream ss(o.cases);
    for (std::string c; std::getline(ss, c, ',');)
      MT_CHECK(c == "A" || c == "B" || c == "A:uniform" || c == "A:skewed" || c == "B:uniform" ||
                   c == "B:skewed",
               ValueError, "bench moe: --cases wants A, B, A:uniform, A:skewed, B:uniform or ",
               "B:skewed (comma-separated), got \"", c, "\"");
  }
  nlohmann::json j = {{"device", cuda_device_name(0)}, {"runs", nlohmann::json::array()}};
  struct Shape5 {
    const char* name;
    int64_t tokens, topk, experts, d, ffn;
  };
  for (const ops::GroupedGemmConfig& gemm : gemms)
    for (const Shape5& s :
         {Shape5{"A", 16384, 8, 64, 2048, 1024}, Shape5{"B", 8192, 8, 256, 2304, 1024}})
      for (bool skewed : {false, true}) {
        if (!moe_case_selected(o.cases, s.name, skewed)) continue;
        log << "bench moe: " << s.name << (skewed ? " skewed" : " uniform") << ", grouped GEMM "
            << ops::grouped_gemm_config_name(gemm) << "\n";
        j["runs"].push_back(
            bench_moe_at(o, gemm, s.name, s.tokens, s.topk, s.experts, s.d, s.ffn, skewed));
        log << j["runs"].back().dump() << "\n";
      }
  return j;
}

nlohmann::json run_dsa_bench(const DsaBenchOptions& o, std::ostream& log) {
  MT_CHECK(cuda_available(), ValueError, "bench dsa: needs a GPU (and a binary built with CUDA)");
  const auto* gen = std::find_if(std::begin(kMqaKernels), std::end(kMqaKernels), [&](auto g) {
    return o.mqa_kernels == ops::sparse_mqa_kernels_name(g);
  });
  MT_CHECK(gen != std::end(kMqaKernels), ValueError,
           "bench dsa: --mqa-kernels wants split, chained, wgmma, wgmma2 or wgmma3, got \"",
           o.mqa_kernels, "\"");
  ops::sparse_mqa_set_kernels(*gen);
  nlohmann::json j = {{"heads", o.heads},
                      {"kv_heads", o.kv_heads ? o.kv_heads : o.heads},
                      {"qk_dim", o.qk_dim},
                      {"v_dim", o.v_dim},
                      {"index_heads", o.index_heads},
                      {"index_dim", o.index_dim},
                      {"topk", o.topk},
                      {"kv_rank", o.kv_rank},
                      {"rope_dim", o.rope_dim},
                      {"device", cuda_device_name(0)},
                      {"runs", nlohmann::json::array()}};
  std::stringstream ss(o.tokens);
  for (std::string tok; std::getline(ss, tok, ',');) {
    int64_t T = 0;
    try {
      T = std::stoll(tok);
    } catch (const std::exception&) {
      MT_THROW(ValueError, "bench dsa: --tokens wants comma-separated lengths, got \"", tok, "\"");
    }
    MT_CHECK(T > 0, ValueError, "bench dsa: length ", T, " must be positive");
    log << "bench dsa: T = " << T << "\n";
    try {
      j["runs"].push_back(bench_dsa_at(o, T));
    } catch (const MemoryError& e) {
      j["runs"].push_back({{"T", T}, {"oom", e.what()}});
    }
    if (j["runs"].back().contains("attention_path"))
      log << "bench dsa: attention path: " << j["runs"].back()["attention_path"].get<std::string>()
          << "\n";
    log << j["runs"].back().dump() << "\n";
  }
  return j;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<StepBenchOptions>();
  auto json_out = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("bench", "benchmarks that print JSON (see docs/gpu.md)");
  CLI::App* s = c->add_subcommand("step", "time one training step of a model on one device");
  c->require_subcommand(1);
  // The options of the benchmarks that build a model (step, decode): its config (weights are
  // random), then, where each puts them, the precision and device a job would give.
  const auto add_model = [](CLI::App* sub, std::string& model) {
    sub->add_option("--model", model, "preset, config.json or HF model directory")->required();
  };
  const auto add_precision_device = [](CLI::App* sub, std::string& precision, std::string& device) {
    sub->add_option("--precision", precision, "fp32 or bf16")->capture_default_str();
    sub->add_option("--device", device, "cpu, cuda or auto")->capture_default_str();
  };
  add_model(s, o->model);
  s->add_option("--tokens", o->tokens, "tokens per step (one document)")->capture_default_str();
  s->add_option("--steps", o->steps, "timed steps")->capture_default_str();
  s->add_option("--warmup", o->warmup, "untimed steps first")->capture_default_str();
  s->add_option("--lora-rank", o->lora_rank, "LoRA rank (0: full training)")->capture_default_str();
  s->add_option("--lora-targets", o->lora_targets,
                "LoRA groups, comma-separated (job.toml's lora.targets); the default matches "
                "hf_lora_step.py's 'grouped' variant, add routed_experts for its 'experts' one")
      ->delimiter(',')
      ->capture_default_str();
  add_precision_device(s, o->precision, o->device);
  s->add_option("--workspace-gib", o->workspace_gib,
                "op scratch on the device (0: the planner's estimate)")
      ->capture_default_str();
  s->add_flag("--deterministic", o->deterministic, "bit-repeatable GPU kernels");
  s->add_option("--threads", o->threads, "CPU threads (0: all)")->capture_default_str();
  s->add_option("--peak-tflops", o->peak_tflops, "device peak for MFU (0: H200 bf16 dense, 989)");
  s->add_option("--lr", o->lr, "AdamW learning rate (every step trains on the same batch)")
      ->capture_default_str();
  s->add_option("--kda-kernels", o->kda_kernels,
                "chunked (ops/cuda/kda_chunk.cu) or direct (ops/cuda/kda.cu, the step before the "
                "chunked kernels)")
      ->check(CLI::IsMember({"chunked", "direct"}))
      ->capture_default_str();
  s->add_flag("--plan-only", o->plan_only,
              "print the planner's memory prediction for the step (cuda unless --device cpu) and "
              "stop, without building the model");
  auto d = std::make_shared<DsaBenchOptions>();
  CLI::App* ds = c->add_subcommand("dsa",
                                   "time the DSA layer's kernels (indexer, top-k, "
                                   "attention, KL) at the benchmark layer's shapes");
  ds->add_option("--tokens", d->tokens, "comma-separated lengths (one document each)")
      ->capture_default_str();
  ds->add_option("--heads", d->heads, "attention heads")->capture_default_str();
  ds->add_option("--kv-heads", d->kv_heads,
                 "key heads (0: one per query head; 1: MQA, the tensor-core sparse kernels)")
      ->capture_default_str();
  ds->add_option("--qk-dim", d->qk_dim, "q/k head dim")->capture_default_str();
  ds->add_option("--v-dim", d->v_dim, "value head dim")->capture_default_str();
  ds->add_option("--index-heads", d->index_heads, "indexer heads")->capture_default_str();
  ds->add_option("--index-dim", d->index_dim, "indexer head dim")->capture_default_str();
  ds->add_option("--topk", d->topk, "index_topk")->capture_default_str();
  ds->add_option("--kv-rank", d->kv_rank,
                 "MLA latent width: attention in the absorbed MQA form, as the DSA layer runs it "
                 "(0: over the per-head keys)")
      ->capture_default_str();
  ds->add_option("--rope-dim", d->rope_dim, "rotary part of qk-dim")->capture_default_str();
  ds->add_option(
        "--mqa-kernels", d->mqa_kernels,
        "the absorbed form's kernels for the layer timings: split, chained, wgmma, wgmma2 or "
        "wgmma3 "
        "(the mqa_*_ms_* fields time all)")
      ->capture_default_str();
  ds->add_option("--iters", d->iters, "timed runs per part")->capture_default_str();
  ds->add_option("--workspace-gib", d->workspace_gib, "op scratch on the device")
      ->capture_default_str();
  auto kb = std::make_shared<KdaBenchOptions>();
  CLI::App* ks = c->add_subcommand("kda",
                                   "time the chunked KDA core, forward and forward+backward, at "
                                   "issue 12's shapes (bench/kda_fla.py: fla's chunk_kda)");
  ks->add_option("--heads", kb->heads, "heads")->capture_default_str();
  ks->add_option("--head-dim", kb->head_dim, "head_k = head_v")->capture_default_str();
  ks->add_option("--iters", kb->iters, "timed runs")->capture_default_str();
  ks->add_option("--warmup", kb->warmup, "untimed runs first")->capture_default_str();
  ks->add_option("--cases", kb->cases,
                 "comma-separated cases (B2_T8192, B1_T65536, packed16_T16384); default all");
  ks->add_flag("--no-overlap", kb->no_overlap,
               "prep, then the state pass, where the overlapped forward would run (for profilers)");
  ks->add_option("--prepared", kb->prepared,
                 "the tensor-core path's prepared block: bf16 (W, Qh, Kl, U, Kb as bf16) or f32")
      ->capture_default_str();
  auto mb = std::make_shared<MoeBenchOptions>();
  CLI::App* ms = c->add_subcommand("moe",
                                   "time the routed experts' grouped SwiGLU FFN (frozen, full, "
                                   "LoRA; eager and from a CUDA graph) and the layer's routing, "
                                   "permutation and combine at issue 14's shapes "
                                   "(bench/moe_torch.py: torch._grouped_mm)");
  ms->add_option("--lora-rank", mb->lora_rank, "LoRA rank of the adapter runs")
      ->capture_default_str();
  ms->add_option("--iters", mb->iters, "timed runs")->capture_default_str();
  ms->add_option("--warmup", mb->warmup, "untimed runs first")->capture_default_str();
  ms->add_option("--cases", mb->cases,
                 "shapes to run, comma-separated: A, B, or one routing of one (A:uniform, "
                 "B:skewed, ...); default: all four");
  ms->add_option("--lora-fwd", mb->lora_fwd,
                 "the LoRA run's SwiGLU forward kernels: separate, staged or registers (default: "
                 "the op's)");
  ms->add_option("--lora-bwd", mb->lora_bwd,
                 "the LoRA run's SwiGLU backward kernels: separate, staged or registers");
  ms->add_option(
      "--lora-og", mb->lora_og,
      "the LoRA run's out_grads kernels (dr, dB over dY): separate, staged or registers");
  ms->add_option("--lora-xa", mb->lora_xa,
                 "the LoRA run's X A^T kernel: gemm (in the gate/up GEMM's mainloop), staged (the "
                 "skinny down kernel) or registers");
  ms->add_option("--lora-dr", mb->lora_dr,
                 "the LoRA run's dr = s dY B_down and dB_down: gemm (in the down dX GEMM's "
                 "mainloop) or staged (the out_grads pass, then the GEMM)");
  ms->add_option("--lora-variants", mb->lora_variants,
                 "the other kernels timed beside the LoRA run: all, none, or a list of "
                 "fwd=<kernels> / bwd=<kernels> / og=<kernels> / xa=<kernels> / dr=<kernels>")
      ->capture_default_str();
  ms->add_flag("--base-only", mb->base_only,
               "time the base runs only (forward, frozen, full, full with dW written): no LoRA, "
               "CUDA graphs or routing, for --gemm sweeps");
  ms->add_option(
      "--gemm", mb->gemm,
      "grouped GEMM configurations to run in turn, comma-separated "
      "(kernel[:sN][:n][:dx=kernel][:dw=kernel][:down=kernel][:swiglu[=fwd|=bwd|=off]][:narrow], "
      "docs/gpu.md; :swiglu times the SwiGLU fused into the GEMMs' epilogues); default: "
      "MOETRAIN_GROUPED_GEMM's or the default");
  auto db = std::make_shared<DecodeBenchOptions>();
  CLI::App* dc = c->add_subcommand("decode",
                                   "incremental decoding tokens/s: a prompt, then greedy "
                                   "single-token steps, with KDA's single-token kernel and with "
                                   "the chunked core (random weights)");
  add_model(dc, db->model);
  dc->add_option("--prompt", db->prompt, "prompt tokens")->capture_default_str();
  dc->add_option("--tokens", db->tokens, "generated tokens (timed)")->capture_default_str();
  add_precision_device(dc, db->precision, db->device);
  dc->add_option("--workspace-gib", db->workspace_gib, "op scratch")->capture_default_str();
  // Last in every benchmark's option list.
  for (CLI::App* sub : {s, ds, ks, ms, dc})
    sub->add_option("--json", *json_out, "also write the result to this file");
  return {c, [o, d, ds, kb, ks, mb, ms, db, dc, json_out] {
            nlohmann::json j;
            if (dc->parsed()) {
              j = run_decode_bench(*db, std::cerr);
            } else if (ms->parsed()) {
              j = run_moe_bench(*mb, std::cerr);
            } else if (ks->parsed()) {
              j = run_kda_bench(*kb, std::cerr);
            } else if (ds->parsed()) {
              j = run_dsa_bench(*d, std::cerr);
            } else {
              if (o->lora_rank == 0) o->lora_targets.clear();
              j = run_step_bench(*o, std::cerr);
            }
            std::cout << j.dump() << "\n";
            if (!json_out->empty()) write_file_atomic(*json_out, j.dump(2) + "\n");
            return 0;
          }};
}

}  // namespace mt::cli
