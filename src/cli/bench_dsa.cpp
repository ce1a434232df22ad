// bench dsa: the DSA layer's parts (indexer, top-k, sparse attention, KL) timed at the benchmark
// layer's shapes, beside bench/dsa_torch.py's plain-PyTorch layer.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>

#include "cli/bench_kernels.h"
#include "cli/bench_util.h"
#include "core/device.h"
#include "core/seq_info.h"
#include "model/mla_layer.h"
#include "ops/attention.h"
#include "ops/indexer.h"
#include "ops/sparse_mqa_attention.h"

namespace mt::cli {

namespace {

// Every generation of the absorbed form's kernels (ops::SparseMqaKernels), by name
// (sparse_mqa_kernels_name) for --mqa-kernels, and each timed by bench dsa.
constexpr ops::SparseMqaKernels kMqaKernels[] = {
    ops::SparseMqaKernels::Split, ops::SparseMqaKernels::Chained, ops::SparseMqaKernels::Wgmma,
    ops::SparseMqaKernels::Wgmma2, ops::SparseMqaKernels::Wgmma3};

// --mqa-kernels by name.
ops::SparseMqaKernels mqa_kernels_named(const std::string& name) {
  const auto* gen = std::find_if(std::begin(kMqaKernels), std::end(kMqaKernels),
                                 [&](auto g) { return name == ops::sparse_mqa_kernels_name(g); });
  MT_CHECK(gen != std::end(kMqaKernels), ValueError,
           "bench dsa: --mqa-kernels wants split, chained, wgmma, wgmma2 or wgmma3, got \"", name,
           "\"");
  return *gen;
}

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
                                .scale = ap.scale,
                                .kernels = mqa_kernels_named(o.mqa_kernels)};
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
  // The KL target: attention's probability mass on each selected position, in the layer's form.
  const auto prob_sum = [&](Tensor& target) {
    if (absorbed)
      ops::sparse_mqa_prob_sum(ctx, mp, qa, kvl, idx, lse, target);
    else
      ops::attention_prob_sum(ctx, ap, q, k, idx, lse, target);
  };
  auto kl_fwd = [&] {
    ArenaScope scope(ctx.workspace());
    Tensor target = ctx.workspace().alloc({T, K}, DType::F32);
    prob_sum(target);
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
    r["mqa_kernels"] = ops::sparse_mqa_kernels_name(mp.kernels);
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
    for (const ops::SparseMqaKernels g : kMqaKernels) {
      ops::SparseMqaParams gp = mp;
      gp.kernels = g;
      const std::string n = ops::sparse_mqa_kernels_name(g);
      ArenaScope scope(ctx.workspace());
      Tensor target = ctx.workspace().alloc({T, K}, DType::F32);
      if (g != ops::SparseMqaKernels::Wgmma3)
        r["mqa_fwd_ms_" + n] =
            time([&] { ops::sparse_mqa_forward(ctx, gp, qa, kvl, idx, ol, lse); });
      if (g == ops::SparseMqaKernels::Wgmma || g == ops::SparseMqaKernels::Wgmma2) continue;
      r["mqa_bwd_ms_" + n] = time([&] {
        ops::sparse_mqa_backward(ctx, gp, qa, kvl, idx, ol, lse, dol, dqa, dkvl, target);
      });
    }
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
    prob_sum(target);
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

}  // namespace

nlohmann::json run_dsa_bench(const DsaBenchOptions& o, std::ostream& log) {
  MT_CHECK(cuda_available(), ValueError, "bench dsa: needs a GPU (and a binary built with CUDA)");
  mqa_kernels_named(o.mqa_kernels);  // refused before any allocation
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

}  // namespace mt::cli
