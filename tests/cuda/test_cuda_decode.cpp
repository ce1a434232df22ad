// Decoding on the GPU against the CPU engine: the decoding ops (cached attention, the indexer's
// top-k over a cache, the KDA recurrent step) through the harness's f32 and bf16 passes, then the
// whole Decoder: a hybrid model (KDA, gated DSA, MLA, dense FFN, latent MoE) decodes a prompt and
// 16 single tokens on both devices, logits compared step by step (the model rows of
// harness/tolerance.h), and greedy generation picks the CPU's ids wherever the CPU's logit margin
// exceeds the two devices' difference. Cache rows past `cached` hold NaN, so a kernel that reads
// one fails. Without a GPU every test skips, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "decode/decode.h"
#include "harness/batch.h"
#include "harness/gpu_check.h"
#include "harness/op_check.h"
#include "harness/tolerance.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "ops/cached_attention.h"
#include "ops/kda_step.h"
#include "ref/cached_attention_ref.h"
#include "train/generate.h"

namespace mt::test {
namespace {

Tensor positions_for(int64_t n, int64_t cached) {
  Tensor t = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) t.i32()[i] = static_cast<int32_t>(cached - n + i);
  return t;
}

// A cache of [capacity, ...] random rows whose rows from `cached` on hold NaN (never to be read).
Tensor cache(Rng& rng, const Shape& s, int64_t cached) {
  Tensor t = randn(rng, s);
  for (int64_t i = cached * (t.numel() / s[0]); i < t.numel(); ++i)
    t.f32()[i] = std::numeric_limits<float>::quiet_NaN();
  return t;
}

void attention_case(const char* name, int64_t n, int64_t cached, int64_t kmax, uint64_t seed) {
  Rng rng(seed);
  const int64_t H = 4, Dqk = 24, Dv = 16, cap = cached + 5;
  Tensor idx;
  if (kmax > 0) {  // random cached positions, -1, slots past the cache (NaN rows or past the
                   // capacity: unused), duplicates (random draws repeat)
    idx = Tensor::empty({n, kmax}, DType::I32);
    for (int64_t i = 0; i < idx.numel(); ++i) {
      const uint64_t r = rng.below(8);
      idx.i32()[i] = r == 0   ? -1
                     : r == 1 ? static_cast<int32_t>(cached + rng.below(cap - cached + 3))
                              : static_cast<int32_t>(rng.below(cached - n + 1));
    }
  }
  std::vector<In> ins = {{randn(rng, {n, H, Dqk})},
                         {cache(rng, {cap, H, Dqk}, cached)},
                         {cache(rng, {cap, H, Dv}, cached)},
                         {positions_for(n, cached), false},
                         {kmax > 0 ? idx : Tensor::zeros({1}, DType::I32), false}};
  const ops::CachedAttentionParams p{.tokens = n,
                                     .heads = H,
                                     .qk_dim = Dqk,
                                     .v_dim = Dv,
                                     .cached = cached,
                                     .kmax = kmax,
                                     .scale = 0.2f};
  run_case(
      name, ins, {"o"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor o = out(c, {n, H, Dv}, in[0].dtype());
        OP(cached_attention_forward)
        (c, p, in[0], in[1], in[2], in[3], kmax > 0 ? in[4] : Tensor(), o);
        return {o};
      },
      seed, cached* Dqk);
}

TEST(CudaDecodeOps, CachedAttentionMatchesTheCpu) {
  REQUIRE_GPU();
  attention_case("dense, one token", 1, 300, 0, fresh_seed());
  attention_case("dense, a prompt", 37, 37, 0, fresh_seed());
  attention_case("index lists", 5, 90, 33, fresh_seed());
}

TEST(CudaDecodeOps, KdaRecurrentStepMatchesTheCpu) {
  REQUIRE_GPU();
  for (const auto& [n, K, V] : std::vector<std::array<int64_t, 3>>{{1, 128, 128}, {4, 64, 40}}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t H = 3;
    Tensor g = randn(rng, {n, H, K}, 0.3), beta = randn(rng, {n, H});
    for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = -std::abs(g.f32()[i]);
    for (int64_t i = 0; i < beta.numel(); ++i)
      beta.f32()[i] = 1.f / (1.f + std::exp(-beta.f32()[i]));
    std::vector<In> ins = {{randn(rng, {n, H, K})}, {randn(rng, {n, H, K}, 0.1)},
                           {randn(rng, {n, H, V})}, {g, false},
                           {beta, false},           {randn(rng, {1, H, K, V}), false}};
    const ops::KdaStepParams p{.tokens = n, .heads = H, .head_k = K, .head_v = V};
    run_case(
        "kda step", ins, {"o", "state"},
        [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
          Tensor state = like(c, in[5]), o = out(c, {n, H, V}, in[0].dtype());
          OP(kda_recurrent_step)(c, p, in[0], in[1], in[2], in[3], in[4], state, o);
          return {o, state};
        },
        seed, n* K);
  }
}

// Integer outputs: the GPU's selection equals the CPU's on f32 tensors whose boundary scores are
// apart (the CPU test checks the CPU against the double reference), and on exact ties.
void check_topk(const char* name, const Tensor& q, const Tensor& k, const Tensor& w,
                const Tensor& pos, int64_t cached, int64_t topk) {
  SCOPED_TRACE(name);
  const int64_t n = q.dim(0);
  const ops::CachedIndexerParams p{
      .tokens = n, .heads = q.dim(1), .head_dim = q.dim(2), .cached = cached, .topk = topk};
  Context cpu;
  Tensor want = Tensor::empty({n, topk}, DType::I32);
  ops::cached_indexer_topk(cpu, p, q, k, w, pos, want);
  Context gpu(ContextOptions{.device = Device::CUDA});
  Tensor got = Tensor::empty({n, topk}, DType::I32, Device::CUDA);
  ops::cached_indexer_topk(gpu, p, like(gpu, q), like(gpu, k), like(gpu, w), like(gpu, pos), got);
  const Tensor h = got.to(Device::CPU);
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_EQ(h.i32()[i], want.i32()[i]) << "row " << i / topk << " slot " << i % topk;
}

// Random scores, redrawn (as the CPU test does) until every row's gap between its last selected
// and first rejected score exceeds 1e-4: the devices sum in different orders, so a closer call
// may go either way in fp32 and exact agreement would be luck. Rows of the cache past the last
// position hold NaN.
void check_clear_topk(Rng& rng, const char* name, int64_t n, int64_t HI, int64_t DI, int64_t cached,
                      int64_t topk) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    Tensor q = randn(rng, {n, HI, DI}), k = cache(rng, {cached + 3, DI}, cached),
           w = randn(rng, {n, HI}), pos = positions_for(n, cached);
    double margin = 0;
    ref::cached_indexer_topk(to_dvec(q), to_dvec(k), to_dvec(w),
                             {pos.i32(), pos.i32() + pos.numel()}, HI, DI, topk,
                             1.0 / std::sqrt(static_cast<double>(DI)), &margin);
    if (margin < 1e-4) continue;
    check_topk(name, q, k, w, pos, cached, topk);
    return;
  }
  ADD_FAILURE() << name << ": no draw with a clear top-k boundary in 50";
}

TEST(CudaDecodeOps, CachedIndexerTopkMatchesTheCpuExactly) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  const int64_t HI = 4, DI = 64, cached = 700;
  check_clear_topk(rng, "one token", 1, HI, DI, cached, 64);
  check_clear_topk(rng, "a prompt", 9, HI, DI, 40, 16);
  // Equal keys: every score ties exactly (each position's sum runs the same arithmetic), the
  // lowest positions win.
  Tensor same = cache(rng, {cached + 3, DI}, cached);
  for (int64_t s = 1; s < cached; ++s)
    for (int64_t e = 0; e < DI; ++e) same.f32()[s * DI + e] = same.f32()[e];
  check_topk("equal keys", randn(rng, {2, HI, DI}), same, randn(rng, {2, HI}),
             positions_for(2, cached), cached, 100);
  // Zero keys: every score is +0 (ReLU's zeros only add to the +0 start), one complete tie.
  check_topk("zero keys", randn(rng, {2, HI, DI}), Tensor::zeros({cached, DI}), randn(rng, {2, HI}),
             positions_for(2, cached), cached, 7);
}

// The device path does not read the positions on the host (the CPU path refuses a bad one), so
// its kernels clamp each row's causal count to [0, cached]: a position past the cache reads every
// cached key and no row beyond (they hold NaN), one below -1 (count < 0) selects nothing and writes
// nothing outside its row. Under compute-sanitizer this is the out-of-bounds check.
TEST(CudaDecodeOps, PositionsOutsideTheCacheStayInside) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  const int64_t HI = 2, DI = 32, cached = 50, topk = 8, H = 2, D = 16;
  Tensor bad = Tensor::empty({3}, DType::I32), clamped = Tensor::empty({3}, DType::I32);
  const int32_t bad_pos[3] = {static_cast<int32_t>(cached) + 40, -7, 5};
  const int32_t clamped_pos[3] = {static_cast<int32_t>(cached) - 1, -1, 5};
  std::copy(bad_pos, bad_pos + 3, bad.i32());
  std::copy(clamped_pos, clamped_pos + 3, clamped.i32());
  Context gpu(ContextOptions{.device = Device::CUDA});

  Tensor q = randn(rng, {3, HI, DI}), k = cache(rng, {cached + 60, DI}, cached),
         w = randn(rng, {3, HI});
  const ops::CachedIndexerParams ip{
      .tokens = 3, .heads = HI, .head_dim = DI, .cached = cached, .topk = topk};
  // The output's 3 rows and a guard row after them, all pre-filled with the guard value.
  const int32_t guard = 12345;
  Tensor fill = Tensor::empty({3 + 1, topk}, DType::I32);
  std::fill(fill.i32(), fill.i32() + fill.numel(), guard);
  Tensor sel = like(gpu, fill), sel3 = sel.rows(0, 3);
  ops::cached_indexer_topk(gpu, ip, like(gpu, q), like(gpu, k), like(gpu, w), like(gpu, bad), sel3);
  const Tensor got = sel.to(Device::CPU);
  // What the clamped positions select, on the same device (row 1: no candidate, all -1).
  Tensor want = Tensor::empty({3, topk}, DType::I32, Device::CUDA);
  ops::cached_indexer_topk(gpu, ip, like(gpu, q), like(gpu, k), like(gpu, w), like(gpu, clamped),
                           want);
  const Tensor wh = want.to(Device::CPU);
  for (int64_t i = 0; i < 3 * topk; ++i)
    EXPECT_EQ(got.i32()[i], wh.i32()[i]) << "row " << i / topk << " slot " << i % topk;
  for (int64_t j = 0; j < topk; ++j) {
    EXPECT_EQ(got.i32()[topk + j], -1) << "slot " << j;
    EXPECT_EQ(got.i32()[3 * topk + j], guard) << "the guard row, slot " << j;
  }

  // Dense attention: the position past the cache attends to every cached key (finite output).
  const ops::CachedAttentionParams ap{
      .tokens = 3, .heads = H, .qk_dim = D, .v_dim = D, .cached = cached, .scale = 0.25f};
  Tensor aq = randn(rng, {3, H, D}), ak = cache(rng, {cached + 60, H, D}, cached),
         av = cache(rng, {cached + 60, H, D}, cached);
  Tensor o_bad = out(gpu, {3, H, D}, DType::F32), o_want = out(gpu, {3, H, D}, DType::F32);
  ops::cached_attention_forward(gpu, ap, like(gpu, aq), like(gpu, ak), like(gpu, av),
                                like(gpu, bad), Tensor(), o_bad);
  ops::cached_attention_forward(gpu, ap, like(gpu, aq), like(gpu, ak), like(gpu, av),
                                like(gpu, clamped), Tensor(), o_want);
  const Tensor ob = o_bad.to(Device::CPU), ow = o_want.to(Device::CPU);
  for (int64_t i = 0; i < ob.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(ob.f32()[i])) << "element " << i;
    EXPECT_EQ(ob.f32()[i], ow.f32()[i]) << "element " << i;
  }
}

ModelConfig hybrid() {
  ModelConfig cfg = ModelConfig::load("tiny");
  cfg.layers.push_back(cfg.layers.back());
  cfg.layers.back().mixer = MixerKind::Mla;  // kda, kda, kda, dsa, mla
  return cfg;
}

constexpr int64_t kPrompt = 20;  // > 16: the prompt runs the chunked KDA, single tokens the step
constexpr int64_t kSteps = 16;

// The logits of a prompt and then kSteps single tokens (the ids `next` picks from each step's
// logits, or `forced` when given), one [V] row per step.
std::vector<std::vector<float>> decode(Context& ctx, Model& m, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& forced) {
  const int64_t V = m.config().vocab;
  Decoder dec(m, kPrompt + kSteps);
  Tensor ids = Tensor::empty({kPrompt}, DType::I32), row = Tensor::empty({1, V});
  std::copy(prompt.begin(), prompt.end(), ids.i32());
  std::vector<std::vector<float>> out;
  dec.step(ctx, ids, row);
  out.emplace_back(row.f32(), row.f32() + V);
  Tensor one = Tensor::empty({1}, DType::I32);
  for (int64_t s = 0; s < kSteps; ++s) {
    one.i32()[0] = forced[static_cast<size_t>(s)];
    dec.step(ctx, one, row);
    out.emplace_back(row.f32(), row.f32() + V);
  }
  return out;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

int32_t argmax(const std::vector<float>& r) {
  return static_cast<int32_t>(std::max_element(r.begin(), r.end()) - r.begin());
}

// Per step: the CPU's logits, the GPU's on the same ids, each within `bound`.
void compare_decoding(Model& cpu, Model& gpu, double bound, uint64_t seed) {
  const int64_t V = cpu.config().vocab;
  Rng rng(seed);
  std::vector<int32_t> prompt, forced;
  for (int64_t i = 0; i < kPrompt; ++i) prompt.push_back(static_cast<int32_t>(rng.below(V)));
  for (int64_t i = 0; i < kSteps; ++i) forced.push_back(static_cast<int32_t>(rng.below(V)));
  Context cc;
  Context gc(ContextOptions{.device = Device::CUDA});
  const auto want = decode(cc, cpu, prompt, forced);
  const auto got = decode(gc, gpu, prompt, forced);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) EXPECT_LE(rel(got[s], want[s]), bound) << "step " << s;

  // Greedy generation on both devices: the ids agree up to the first step where the CPU's margin
  // between its best two logits is within the devices' difference (a near-tie either may break).
  SamplingOptions greedy{.max_new = kSteps, .temperature = 0.f};
  Generator gen_c(cpu), gen_g(gpu);
  const std::vector<int32_t> ids_c = gen_c.generate(cc, prompt, greedy);
  const std::vector<int32_t> ids_g = gen_g.generate(gc, prompt, greedy);
  const auto cpu_greedy = decode(cc, cpu, prompt, ids_c);
  const auto gpu_greedy = decode(gc, gpu, prompt, ids_c);
  int64_t decided = 0;
  for (int64_t s = 0; s < kSteps; ++s) {
    const std::vector<float>& c = cpu_greedy[static_cast<size_t>(s)];
    const std::vector<float>& g = gpu_greedy[static_cast<size_t>(s)];
    std::vector<float> sorted = c;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    double diff = 0;
    for (int64_t v = 0; v < V; ++v)
      diff = std::max(diff, std::abs(static_cast<double>(g[v]) - c[v]));
    if (sorted[0] - sorted[1] <= 2 * diff) break;  // from here the devices may part
    EXPECT_EQ(ids_c[static_cast<size_t>(s)], argmax(c)) << "step " << s;
    ASSERT_EQ(ids_g[static_cast<size_t>(s)], ids_c[static_cast<size_t>(s)]) << "step " << s;
    ++decided;
  }
  EXPECT_GT(decided, 0) << "the first step's margin was within the devices' difference";
}

TEST(CudaDecode, Fp32LogitsMatchTheCpuStepByStep) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Model cpu(hybrid(), seed);
  Model gpu(hybrid(), seed);
  gpu.to_device(Device::CUDA);
  compare_decoding(cpu, gpu, kModelF32Rel, seed);
}

// bf16 weights, activations and caches on the GPU against the CPU's fp32 model holding the same
// bf16-rounded weights. The bound is the bf16 model row's tensor bound: every stored activation
// and cached key rounds to bf16, and a rounding may flip a near-tie of the router or the indexer.
TEST(CudaDecode, Bf16LogitsStayWithinTheModelBound) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Model gpu(hybrid(), seed, {.precision = Precision::bf16(), .device = Device::CUDA});
  Model cpu(hybrid(), seed);
  for (const auto& p : cpu.params().all()) p->value.copy_from(gpu.params().at(p->name).value);
  compare_decoding(cpu, gpu, kModelBf16GradRel, seed);
  // The LM head's result stays fp32 on the device: a bf16 result widened on the way would leave
  // every logit's low 16 bits zero, sampling would see ~3 digits (greedy ties to the lowest id).
  Context gc(ContextOptions{.device = Device::CUDA});
  Decoder dec(gpu, 4);
  const int64_t V = gpu.config().vocab;
  Tensor ids = Tensor::empty({3}, DType::I32), row = Tensor::empty({1, V});
  for (int64_t i = 0; i < 3; ++i) ids.i32()[i] = static_cast<int32_t>(i + 1);
  dec.step(gc, ids, row);
  int64_t finer = 0;
  for (int64_t v = 0; v < V; ++v) {
    uint32_t bits = 0;
    std::memcpy(&bits, row.f32() + v, sizeof bits);
    finer += (bits & 0xffffu) != 0;
  }
  EXPECT_GT(finer, V / 2) << "of " << V << " logits, " << finer << " carry bits below bf16's";
}

// Decoding leaves the expert loads as it found them, from non-zero device counts: each MoE layer
// counts into workspace scratch during a step and puts its own count back, which a later training
// forward still counts into (every token adds top_k routes, whatever the routing).
TEST(CudaDecode, ExpertLoadsSurviveDecoding) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Model gpu(hybrid(), seed);
  gpu.to_device(Device::CUDA);
  Rng rng(seed);
  Batch docs = random_batch(rng, gpu.config().vocab, {23, 9}, 7);
  docs.ids = docs.ids.to(Device::CUDA);
  docs.targets = docs.targets.to(Device::CUDA);
  docs.seq.cu_seqlens = docs.seq.cu_seqlens.to(Device::CUDA);
  docs.seq.positions = docs.seq.positions.to(Device::CUDA);
  Context gc(ContextOptions{.device = Device::CUDA, .seed = seed});
  gpu.forward(gc, docs.seq, docs.ids, docs.targets);
  auto sum = [](const std::vector<int64_t>& l) {
    return std::accumulate(l.begin(), l.end(), int64_t{0});
  };
  std::vector<std::vector<int64_t>> loads;
  for (MoeLayer* m : gpu.moe_layers())
    if (m) {
      loads.push_back(m->expert_load());
      EXPECT_GT(sum(loads.back()), 0);
    }
  ASSERT_FALSE(loads.empty());
  std::vector<int32_t> prompt(kPrompt), forced(kSteps);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng.below(gpu.config().vocab));
  for (int32_t& t : forced) t = static_cast<int32_t>(rng.below(gpu.config().vocab));
  decode(gc, gpu, prompt, forced);
  size_t i = 0;
  for (MoeLayer* m : gpu.moe_layers())
    if (m) {
      EXPECT_EQ(m->expert_load(), loads[i]) << "MoE layer " << i;
      ++i;
    }
  gpu.forward(gc, docs.seq, docs.ids, docs.targets);
  i = 0;
  for (MoeLayer* m : gpu.moe_layers())
    if (m) {
      EXPECT_EQ(sum(m->expert_load()), 2 * sum(loads[i])) << "MoE layer " << i;
      ++i;
    }
}

TEST(CudaDecode, DecoderStateLivesOnTheModelsDevice) {
  REQUIRE_GPU();
  Model gpu(hybrid(), fresh_seed());
  gpu.to_device(Device::CUDA);
  Decoder dec(gpu, 8);
  Context cc;  // a host context for a GPU model is refused, naming both devices
  Tensor ids = Tensor::zeros({2}, DType::I32), logits = Tensor::empty({2, gpu.config().vocab});
  EXPECT_THROW(dec.step(cc, ids, logits), ValueError);
}

// A model whose heads the decoding kernels cannot hold in shared memory (ops::kda_step_fits,
// cached_attention_fits) is refused when its Decoder is built on the GPU: a ShapeError naming the
// layer, its mixer and the dims, before a cache is allocated (the CPU decodes it:
// Decode.GpuKernelLimitsAndWideHeadsOnTheCpu).
TEST(CudaDecode, ShapesTheKernelsRejectAreRefusedUpFront) {
  REQUIRE_GPU();
  ModelConfig base = ModelConfig::load("tiny");
  base.layers = {{MixerKind::Kda, FfnKind::Dense}, {MixerKind::Mla, FfnKind::Dense}};
  ModelConfig wide_kda = base, wide_mla = base;
  wide_kda.kda.head_dim = 260;
  wide_mla.mla.v_head_dim = 3100;
  for (const auto& [cfg, expect] :
       {std::pair{wide_kda, std::string("layer 0 (kda): the KDA step's head_dim 260")},
        std::pair{wide_mla, std::string("layer 1 (mla): cached attention's head dims")}}) {
    Model gpu(cfg, 1);
    gpu.to_device(Device::CUDA);
    try {
      Decoder dec(gpu, 8);
      ADD_FAILURE() << "built a Decoder for " << expect;
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  }
  Model fits(base, 1);
  fits.to_device(Device::CUDA);
  EXPECT_NO_THROW(Decoder(fits, 8));
}

}  // namespace
}  // namespace mt::test
