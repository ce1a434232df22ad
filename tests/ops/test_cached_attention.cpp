// The decoding ops (ops/cached_attention.h, ops/kda_step.h) against their double references:
// attention over a KV cache (dense causal and index lists), the indexer's top-k over cached
// positions, and the KDA recurrence from a carried state. Cache rows past `cached` hold NaN, so a
// body that reads them fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/cached_attention.h"
#include "ops/kda.h"
#include "ops/kda_step.h"
#include "ref/cached_attention_ref.h"
#include "ref/kda_ref.h"

namespace mt::test {
namespace {

Tensor randn(Rng& rng, const Shape& s, double scale = 1.0) {
  Tensor t = Tensor::empty(s);
  fill_normal(rng, t, scale);
  return t;
}

// A cache of `capacity` rows whose rows from `cached` on are NaN (never to be read).
Tensor cache(Rng& rng, const Shape& s, int64_t cached) {
  Tensor t = randn(rng, s);
  const int64_t row = t.numel() / s[0];
  for (int64_t i = cached * row; i < t.numel(); ++i)
    t.f32()[i] = std::numeric_limits<float>::quiet_NaN();
  return t;
}

Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::I32);
  std::copy(v.begin(), v.end(), t.i32());
  return t;
}

std::vector<int32_t> ints(const Tensor& t) {
  return {t.i32(), t.i32() + t.numel()};
}

struct AttnCase {
  int64_t n, H, Dqk, Dv, cached, capacity;
};

void check_attention(const AttnCase& c, bool listed, Rng& rng) {
  Context ctx;
  const float scale = 0.37f;
  Tensor q = randn(rng, {c.n, c.H, c.Dqk}), k = cache(rng, {c.capacity, c.H, c.Dqk}, c.cached),
         v = cache(rng, {c.capacity, c.H, c.Dv}, c.cached);
  std::vector<int32_t> pos;
  for (int64_t i = 0; i < c.n; ++i) pos.push_back(static_cast<int32_t>(c.cached - c.n + i));
  // Index lists: random causal positions, -1, positions past the cache, duplicates, an empty row.
  const int64_t kmax = listed ? 9 : 0;
  std::vector<int32_t> idx;
  for (int64_t i = 0; i < c.n && listed; ++i)
    for (int64_t j = 0; j < kmax; ++j) {
      const int64_t r = rng.below(10);
      const int32_t s = i == 1            ? -1
                        : r == 0          ? -1
                        : r == 1          ? static_cast<int32_t>(c.cached + 1)
                        : r == 2 && j > 0 ? idx.back()
                                          : static_cast<int32_t>(rng.below(pos[i] + 1));
      idx.push_back(s);
    }
  Tensor indices = listed ? i32(idx).view({c.n, kmax}) : Tensor();
  Tensor o = Tensor::empty({c.n, c.H, c.Dv});
  ops::cached_attention_forward(ctx,
                                {.tokens = c.n,
                                 .heads = c.H,
                                 .qk_dim = c.Dqk,
                                 .v_dim = c.Dv,
                                 .cached = c.cached,
                                 .kmax = kmax,
                                 .scale = scale},
                                q, k, v, i32(pos), indices, o);
  const DVec want = ref::cached_attention(to_dvec(q), to_dvec(k), to_dvec(v), pos, idx, kmax, c.H,
                                          c.Dqk, c.Dv, c.cached, scale);
  EXPECT_LE(rel_err(to_dvec(o), want), 1e-5);
  if (listed) {  // row 1 lists no key
    for (int64_t e = 0; e < c.H * c.Dv; ++e) EXPECT_EQ(o.f32()[c.H * c.Dv + e], 0.f);
  }
}

TEST(CachedAttention, DenseCausalMatchesReference) {
  Rng rng(test_seed());
  check_attention({.n = 1, .H = 3, .Dqk = 10, .Dv = 7, .cached = 23, .capacity = 30}, false, rng);
  check_attention({.n = 6, .H = 2, .Dqk = 17, .Dv = 5, .cached = 6, .capacity = 9}, false, rng);
  check_attention({.n = 4, .H = 1, .Dqk = 64, .Dv = 33, .cached = 71, .capacity = 71}, false, rng);
}

TEST(CachedAttention, IndexListsMatchReference) {
  Rng rng(test_seed());
  check_attention({.n = 5, .H = 3, .Dqk = 10, .Dv = 7, .cached = 23, .capacity = 30}, true, rng);
  check_attention({.n = 3, .H = 2, .Dqk = 9, .Dv = 12, .cached = 4, .capacity = 8}, true, rng);
}

TEST(CachedAttention, RejectsBadShapesAndPositions) {
  Context ctx;
  Rng rng(test_seed());
  const ops::CachedAttentionParams p{
      .tokens = 2, .heads = 2, .qk_dim = 4, .v_dim = 3, .cached = 5, .scale = 1.f};
  Tensor q = randn(rng, {2, 2, 4}), k = randn(rng, {6, 2, 4}), v = randn(rng, {6, 2, 3}),
         o = Tensor::empty({2, 2, 3});
  Tensor bad_q = randn(rng, {2, 3, 4}), short_k = randn(rng, {4, 2, 4});
  EXPECT_THROW(ops::cached_attention_forward(ctx, p, bad_q, k, v, i32({3, 4}), Tensor(), o),
               ShapeError);
  EXPECT_THROW(ops::cached_attention_forward(ctx, p, q, short_k, v, i32({3, 4}), Tensor(), o),
               ShapeError);
  try {
    ops::cached_attention_forward(ctx, p, q, k, v, i32({3, 5}), Tensor(), o);
    ADD_FAILURE() << "a position past the cache was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(e.message().find("position 5 of row 1"), std::string::npos) << e.message();
  }
}

// The selection, compared exactly with the double reference on draws whose boundary scores are
// far apart (fp32 could order a near-tie otherwise).
void check_topk(Rng& rng, int64_t n, int64_t HI, int64_t DI, int64_t cached, int64_t topk,
                bool tie_keys) {
  Context ctx;
  for (int attempt = 0; attempt < 50; ++attempt) {
    Tensor q = randn(rng, {n, HI, DI}), k = cache(rng, {cached + 3, DI}, cached),
           w = randn(rng, {n, HI});
    if (tie_keys)  // every key equal: every score ties, the lowest positions win
      for (int64_t s = 1; s < cached; ++s)
        for (int64_t e = 0; e < DI; ++e) k.f32()[s * DI + e] = k.f32()[e];
    std::vector<int32_t> pos;
    for (int64_t i = 0; i < n; ++i)
      pos.push_back(
          static_cast<int32_t>(i == 0 ? rng.below(std::min(topk, cached)) : cached - n + i));
    const double scale = 1.0 / std::sqrt(static_cast<double>(DI));
    double margin = 0;
    const std::vector<int32_t> want = ref::cached_indexer_topk(to_dvec(q), to_dvec(k), to_dvec(w),
                                                               pos, HI, DI, topk, scale, &margin);
    if (!tie_keys && margin < 1e-4) continue;
    Tensor out = Tensor::empty({n, topk}, DType::I32);
    ops::cached_indexer_topk(
        ctx, {.tokens = n, .heads = HI, .head_dim = DI, .cached = cached, .topk = topk}, q, k, w,
        i32(pos), out);
    EXPECT_EQ(ints(out), want) << "margin " << margin;
    return;
  }
  ADD_FAILURE() << "no draw with a clear top-k boundary in 50";
}

TEST(CachedIndexerTopk, MatchesReference) {
  Rng rng(test_seed());
  check_topk(rng, 4, 3, 16, 40, 7, false);  // row 0 has fewer positions than topk: -1 padding
  check_topk(rng, 1, 2, 8, 25, 8, false);   // one token, as decoding runs
  check_topk(rng, 3, 4, 32, 9, 20, false);  // topk above every row's count
}

TEST(CachedIndexerTopk, TiesGoToTheLowerPosition) {
  Rng rng(test_seed());
  check_topk(rng, 3, 2, 8, 30, 5, true);
  // All-zero keys: every score is zero, one complete tie. A negative weight adds -1 * ReLU's 0 =
  // -0 to the +0 sum, which stays +0 (so there is one zero, not two).
  Context ctx;
  Tensor q = randn(rng, {1, 2, 8}), k = Tensor::zeros({12, 8}), w = randn(rng, {1, 2});
  w.f32()[0] = -1.f;
  Tensor out = Tensor::empty({1, 4}, DType::I32);
  ops::cached_indexer_topk(ctx, {.tokens = 1, .heads = 2, .head_dim = 8, .cached = 12, .topk = 4},
                           q, k, w, i32({11}), out);
  EXPECT_EQ(ints(out), (std::vector<int32_t>{0, 1, 2, 3}));
}

// The recurrence from a random state against the reference from the same state, for the token
// counts decoding uses; a strong decay (g near -30) must leave the state's contribution at ~0.
void check_kda_step(Rng& rng, int64_t n, int64_t H, int64_t K, int64_t V, double g_shift) {
  Context ctx;
  Tensor q = randn(rng, {n, H, K}), k = randn(rng, {n, H, K}, 0.3), v = randn(rng, {n, H, V}),
         g = randn(rng, {n, H, K}, 0.2), beta = randn(rng, {n, H}), h0 = randn(rng, {1, H, K, V});
  for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = -std::abs(g.f32()[i]) + g_shift;
  for (int64_t i = 0; i < beta.numel(); ++i) beta.f32()[i] = 1.f / (1.f + std::exp(beta.f32()[i]));
  Tensor state = Tensor::empty({1, H, K, V}), o = Tensor::empty({n, H, V});
  state.copy_from(h0);
  ops::kda_recurrent_step(ctx, {.tokens = n, .heads = H, .head_k = K, .head_v = V}, q, k, v, g,
                          beta, state, o);
  const auto [want_o, want_h] =
      ref::kda({.heads = H, .head_k = K, .head_v = V, .offsets = {0, n}}, to_dvec(q), to_dvec(k),
               to_dvec(v), to_dvec(g), to_dvec(beta), to_dvec(h0));
  EXPECT_LE(rel_err(to_dvec(o), want_o), 1e-5) << "n=" << n;
  EXPECT_LE(rel_err(to_dvec(state), want_h), 1e-5) << "n=" << n;
}

TEST(KdaRecurrentStep, MatchesReference) {
  Rng rng(test_seed());
  check_kda_step(rng, 1, 3, 12, 9, 0.0);
  check_kda_step(rng, 5, 2, 16, 16, 0.0);
  check_kda_step(rng, 1, 2, 64, 70, 0.0);
  check_kda_step(rng, 3, 2, 8, 8, -30.0);
}

// The step and the chunked op agree from the same state: the decoder uses one for single tokens,
// the other for prompts.
TEST(KdaRecurrentStep, AgreesWithTheChunkedOp) {
  Context ctx;
  Rng rng(test_seed());
  const int64_t n = 3, H = 2, K = 16;
  Tensor q = randn(rng, {n, H, K}), k = randn(rng, {n, H, K}, 0.3), v = randn(rng, {n, H, K}),
         g = randn(rng, {n, H, K}, 0.2), beta = Tensor::empty({n, H}),
         h0 = randn(rng, {1, H, K, K});
  for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = -std::abs(g.f32()[i]);
  for (int64_t i = 0; i < beta.numel(); ++i) beta.f32()[i] = static_cast<float>(rng.uniform());
  Tensor cu = i32({0, static_cast<int32_t>(n)});
  const ops::KdaParams cp{.tokens = n, .heads = H, .head_k = K, .head_v = K, .num_seqs = 1};
  Tensor o_chunk = Tensor::empty({n, H, K}), hT = Tensor::empty({1, H, K, K});
  Tensor saved = Tensor::empty({ops::kda_saved_rows(cp, cu), H, K, K}), none;
  ops::kda_forward(ctx, cp, cu, q, k, v, g, beta, h0, o_chunk, hT, saved, none);
  Tensor state = Tensor::empty({1, H, K, K}), o = Tensor::empty({n, H, K});
  state.copy_from(h0);
  ops::kda_recurrent_step(ctx, {.tokens = n, .heads = H, .head_k = K, .head_v = K}, q, k, v, g,
                          beta, state, o);
  EXPECT_LE(rel_err(to_dvec(o), to_dvec(o_chunk)), 1e-5);
  EXPECT_LE(rel_err(to_dvec(state), to_dvec(hT)), 1e-5);
}

// A bf16 state (the state stays fp32) and a state one value column too wide: both refused, the
// message naming the state.
TEST(KdaRecurrentStep, RejectsANarrowState) {
  Context ctx;
  Rng rng(test_seed());
  Tensor q = randn(rng, {1, 2, 4}), v = randn(rng, {1, 2, 4}), beta = randn(rng, {1, 2}),
         o = Tensor::empty({1, 2, 4});
  const ops::KdaStepParams p{.tokens = 1, .heads = 2, .head_k = 4, .head_v = 4};
  Tensor bf16_state = Tensor::empty({2, 4, 4}, DType::BF16);
  EXPECT_THROW(ops::kda_recurrent_step(ctx, p, q, q, v, q, beta, bf16_state, o), ShapeError);
  Tensor wide = randn(rng, {1, 2, 4, 5});
  try {
    ops::kda_recurrent_step(ctx, p, q, q, v, q, beta, wide, o);
    ADD_FAILURE() << "a [1, 2, 4, 5] state was accepted for head_v 4";
  } catch (const ShapeError& e) {
    EXPECT_NE(e.message().find("state has shape [1,2,4,5]"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace mt::test
