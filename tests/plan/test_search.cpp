// Strategy search, cost model inputs, kernel matching and the seed-scale arithmetic, each against
// figures written by hand from the config.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>

#include "core/error.h"
#include "ops/kda.h"
#include "plan/report.h"

namespace mt::plan {
namespace {

ModelConfig seed_lora() {
  return with_lora(ModelConfig::load("seed-2.8t"), {.rank = 16, .alpha = 32});
}

Hardware h200(double gb) {
  Hardware hw;
  hw.mem_bytes = gb * 1e9;
  return hw;
}

TEST(PlanSearch, InvalidRequestsAreExplained) {
  const ModelConfig cfg = seed_lora();
  SearchOptions o;
  o.ep = 3;
  try {
    search(cfg, 96, h200(80), o);
    FAIL() << "ep 3 accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide the 896 routed experts"),
              std::string::npos)
        << e.what();
  }
  o.ep = 256;
  EXPECT_THROW(search(cfg, 128, h200(80), o), ValueError);
  o.ep.reset();
  o.fsdp = 3;
  EXPECT_THROW(search(cfg, 128, h200(80), o), ValueError);
  EXPECT_THROW(search(cfg, 0, h200(80), {}), ValueError);
  EXPECT_EQ(invalid_reason(cfg, {.world = 128, .ep = 64, .replicas = 2, .expert_shard = 4}),
            "expert_shard 4 does not divide the 2 expert replicas");
}

TEST(PlanSearch, TooLittleMemoryGivesReasonsNotACrash) {
  const SearchResult r = search(seed_lora(), 8, h200(80), {});
  EXPECT_TRUE(r.best.empty());
  ASSERT_FALSE(r.rejections.empty());
  int64_t n = 0;
  for (const auto& g : r.rejections) {
    n += g.count;
    EXPECT_GT(g.closest.memory.total(), 80e9);
  }
  EXPECT_EQ(n, r.considered);
}

TEST(PlanSearch, SeedScaleArithmetic) {
  const ModelConfig cfg = seed_lora();
  const ParamCounts c = count_params(cfg, true);
  // 2.77T parameters at 2 bytes: 5.5 TB, 70 devices of 80 GB just to hold them.
  EXPECT_EQ(devices_for_weights(c.total, 2, 80e9), 70);
  // FSDP over 128 + EP 64 without expert sharding: 14 whole experts of every MoE layer per rank.
  const ParallelPlan p{.world = 128, .fsdp = 128, .ep = 64, .replicas = 2, .seq = 4096};
  const MemoryBreakdown m = predict_memory(cfg, p, {});
  const double expert_per_rank = 92.0 * 14 * 3 * 3584 * 3072;
  const double dense = static_cast<double>(c.total - c.expert);
  // The routers' selection biases (one per expert of each MoE layer) stay fp32: 2 B more each;
  // so do the KDA layers' A_log and dt_bias (ParamSpec::keep_fp32), which are frozen under LoRA.
  const double buffers = 92.0 * 896;
  EXPECT_EQ(static_cast<double>(c.buffers), buffers);
  double kept = 0;
  for (const NamedSpec& s : model_param_specs(cfg))
    if (s.spec.keep_fp32) kept += static_cast<double>(s.spec.shape.numel());
  const double wide = buffers + kept;
  EXPECT_NEAR(m.weights, (dense / 128 + expert_per_rank) * 2 + wide / 128 * 2, 1e3);
  EXPECT_GT(m.weights, 80e9);  // the experts alone overflow an 80 GB device
  // LoRA: gradients and optimizer only for the adapters (sharded 128 ways).
  EXPECT_NEAR(m.optimizer, static_cast<double>(c.trainable) / 128 * 8, 1);
  // Sharding the experts across the two replicas halves them.
  ParallelPlan q = p;
  q.expert_shard = 2;
  EXPECT_NEAR(predict_memory(cfg, q, {}).weights,
              (dense / 128 + expert_per_rank / 2) * 2 + wide / 128 * 2, 1e3);
}

TEST(PlanSearch, BestPlansFitAndAreRankedUnderTenSeconds) {
  const auto t0 = std::chrono::steady_clock::now();
  PlanRequest q{.model_name = "seed-2.8t", .cfg = seed_lora(), .world = 128, .hw = h200(80)};
  q.options.lora = {.rank = 16, .alpha = 32};
  const PlanReport r = run_plan(q);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0);
  ASSERT_FALSE(r.result.best.empty());
  for (size_t i = 0; i < r.result.best.size(); ++i) {
    const Evaluated& e = r.result.best[i];
    EXPECT_LE(e.memory.total(), 80e9);
    EXPECT_TRUE(e.rejected.empty());
    EXPECT_EQ(invalid_reason(q.cfg, e.plan), "");
    EXPECT_GT(e.mfu, 0);
    EXPECT_LT(e.mfu, 1);
    if (i > 0) {
      EXPECT_LE(e.tokens_per_s, r.result.best[i - 1].tokens_per_s);
    }
  }
  EXPECT_FALSE(r.result.notes.empty());
  // More memory never makes the best plan slower.
  q.hw = h200(128);
  EXPECT_GE(run_plan(q).result.best.front().tokens_per_s, r.result.best.front().tokens_per_s);
}

TEST(PlanSearch, AllToAllBandwidthFollowsTheMeasuredCurve) {
  const Hardware hw;
  EXPECT_DOUBLE_EQ(hw.a2a_bw(8.0 * (1 << 20)), 69e9);
  EXPECT_DOUBLE_EQ(hw.a2a_bw(256.0 * (1 << 20)), 282e9);
  EXPECT_DOUBLE_EQ(hw.a2a_bw(1e12), 323e9);
  EXPECT_DOUBLE_EQ(hw.a2a_bw(1), 69e9);
  double prev = 0;
  for (double b = 1e6; b < 2e9; b *= 1.5) {
    EXPECT_GE(hw.a2a_bw(b), prev);
    prev = hw.a2a_bw(b);
  }
}

TEST(PlanFlops, TermsAgainstHandFormulas) {
  const ModelConfig cfg = ModelConfig::load("tiny");
  const MoeConfig& m = cfg.moe;
  int64_t moe = 0, dsa = 0, kda = 0;
  for (const LayerIR& l : cfg.layers) {
    moe += l.ffn == FfnKind::Moe;
    dsa += l.mixer == MixerKind::Dsa;
    kda += l.mixer == MixerKind::Kda;
  }
  // seq <= index_topk: sparse attention attends to every previous position.
  const int64_t s = cfg.dsa.index_topk;
  const StepFlops f = flops_per_token(cfg, s, false, Recompute::None);
  EXPECT_DOUBLE_EQ(f.forward.expert_gemm,
                   static_cast<double>(moe * 2 * m.top_k * 3 * m.latent * m.expert_ffn));
  const MlaConfig& a = cfg.dsa.mla;
  EXPECT_DOUBLE_EQ(f.forward.attn_sparse, static_cast<double>(dsa) * 2 * a.heads *
                                              (a.qk_nope_dim + a.qk_rope_dim + a.v_head_dim) *
                                              (s + 1) / 2.0);
  const double C = static_cast<double>(std::min(cfg.kda.chunk, s)), D = cfg.kda.head_dim;
  EXPECT_DOUBLE_EQ(f.forward.kda_core,
                   static_cast<double>(kda * cfg.kda.heads) * (5 * C * D + 6 * D * D));
  EXPECT_DOUBLE_EQ(f.train.expert_gemm, 3 * f.forward.expert_gemm);
  EXPECT_DOUBLE_EQ(f.recompute.total(), 0);
  // Past top-k the sparse term stops growing with the context; the indexer keeps growing.
  const StepFlops longer = flops_per_token(cfg, 64 * s, false, Recompute::Full);
  EXPECT_LT(longer.forward.attn_sparse, 1.01 * 2 * f.forward.attn_sparse);
  EXPECT_GT(longer.forward.indexer, 20 * f.forward.indexer);
  EXPECT_NEAR(longer.recompute.total(), longer.forward.total() - 2.0 * cfg.vocab * cfg.hidden,
              1e-6 * longer.forward.total());
}

TEST(PlanKernels, ChoicesAndFallbacks) {
  const KernelRegistry reg = KernelRegistry::builtin();
  KernelChoice c = reg.choose(OpKind::KdaCore, Backend::Cpu, {.head_dim = 128, .chunk = 64});
  EXPECT_EQ(c.kernel, "kda_chunked_cpu");
  EXPECT_FALSE(c.fallback);
  c = reg.choose(OpKind::KdaCore, Backend::Cpu, {.head_dim = 128, .chunk = 64, .chunked = false});
  EXPECT_EQ(c.kernel, "kda_recurrent_cpu");
  EXPECT_TRUE(c.fallback);
  EXPECT_NE(c.why.find("recurrence"), std::string::npos);
  c = reg.choose(OpKind::KdaCore, Backend::Cuda, {.dtype = "bf16", .head_dim = 128, .chunk = 64});
  if (MOETRAIN_WITH_CUDA) {
    EXPECT_FALSE(c.fallback);
    EXPECT_EQ(c.kernel, "kda_chunk_cuda");
    c = reg.choose(OpKind::KdaCore, Backend::Cuda, {.dtype = "bf16", .head_dim = 512, .chunk = 64});
  }
  EXPECT_TRUE(c.fallback);
  EXPECT_EQ(c.kernel, "kda_chunked_cpu");
  // Built, the chunked kernel names the bound it rejects; without CUDA, the missing backend.
  EXPECT_NE(c.why.find(MOETRAIN_WITH_CUDA ? "head_dim 512 > 128" : "not built"), std::string::npos)
      << c.why;
  // Every op of every layer kind of the seed model gets a kernel.
  const auto all = match_kernels(seed_lora(), Backend::Cpu, "fp32");
  EXPECT_GE(all.size(), 15u);
  for (const KernelChoice& k : all) EXPECT_FALSE(k.kernel.empty()) << op_name(k.op);
  // Decoding's ops, once per mixer after the training ops: the KDA step for KDA layers, cached
  // attention (and the indexer over its cache, for DSA) for the attention layers.
  std::set<std::string> decoding;
  for (const KernelChoice& k : all)
    if (k.layer.ends_with(" (decoding)")) decoding.insert(k.layer + ": " + k.kernel);
  std::set<std::string> mixers;
  for (const LayerIR& l : seed_lora().layers) mixers.insert(mixer_name(l.mixer));
  ASSERT_TRUE(mixers.count("kda")) << "the seed model has KDA layers";
  EXPECT_TRUE(decoding.count("kda (decoding): kda_step_cpu"));
  for (const std::string& m : mixers) {
    if (m != "kda") {
      EXPECT_TRUE(decoding.count(m + " (decoding): cached_attention_cpu")) << m;
    }
  }
  EXPECT_EQ(decoding.count("dsa (decoding): cached_indexer_cpu"),
            mixers.count("dsa") && !seed_lora().dsa.dense_warmup ? 1u : 0u);
}

// `bench step --kda-kernels direct` (the job's kernels.kda = "chunk_kernels=off"): with the
// chunked kernels switched off no params fit them, and the op table (which the planner and the
// layers read) names the direct kernel with the reason; the config carries the choice to both.
TEST(PlanKernels, ChunkedKdaKernelsSwitchedOff) {
  ops::KdaParams p{.head_k = 128, .head_v = 128, .chunked = true, .chunk = 64};
  ASSERT_TRUE(ops::kda_chunk_kernel_fits(p));
  p.kernels = ops::parse_kda_kernels("chunk_kernels=off");
  EXPECT_FALSE(ops::kda_chunk_kernel_fits(p));
  const KernelRegistry reg = KernelRegistry::builtin();
  const OpShape off{.dtype = "bf16", .head_dim = 128, .chunk = 64, .kda_chunk_kernels = false};
  const KernelChoice c = reg.choose(OpKind::KdaCore, Backend::Cuda, off);
  std::string chunk_why, on_why = "unset";
  for (const KernelImpl& k : reg.impls(OpKind::KdaCore))
    if (k.name == "kda_chunk_cuda") {
      chunk_why = k.accepts(off);
      on_why = k.accepts({.head_dim = 128, .chunk = 64});
    }
  EXPECT_NE(chunk_why.find("switched off"), std::string::npos) << chunk_why;
  EXPECT_EQ(on_why, "");
  EXPECT_EQ(c.kernel, MOETRAIN_WITH_CUDA ? "kda_direct_cuda" : "kda_chunked_cpu");
  // Through the config: the layer kernels of a KDA model follow cfg.kda.kernels.
  ModelConfig cfg = seed_lora();
  cfg.kda.kernels.chunk_kernels = false;
  int kda_ops = 0;
  for (const LayerKernels& lk : layer_kernels(cfg, Backend::Cuda, "bf16"))
    for (const OpKernel& k : lk.ops)
      if (k.op == op_name(OpKind::KdaCore)) {
        ++kda_ops;
        EXPECT_EQ(k.kernel, MOETRAIN_WITH_CUDA ? "kda_direct_cuda" : "kda_chunked_cpu");
      }
  EXPECT_GT(kda_ops, 0) << "the seed model has KDA layers";
}

}  // namespace
}  // namespace mt::plan
