// The lightning indexer on the GPU against the CPU engine: scores and their gradients on dense and
// sparse tables, top-k selection (integer outputs must match exactly, ties going to the lower
// position, duplicates and unused slots in the candidates, a long context), and the KL loss with
// its gradient. Without a GPU every test skips, saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/seq_info.h"
#include "harness/gpu_check.h"
#include "ops/attention.h"
#include "ops/indexer.h"

namespace mt::test {
namespace {

Tensor causal_table(const std::vector<int64_t>& lengths, int64_t K) {
  const SeqInfo seq = SeqInfo::from_lengths(lengths);
  Tensor t = Tensor::empty({seq.tokens, K}, DType::I32);
  ops::causal_indices(seq, t);
  return t;
}

// Random causal positions of each row's document, with -1 slots, duplicates and (when
// `empty_every` > 0) some rows left empty.
Tensor random_table(Rng& rng, const std::vector<int64_t>& lengths, int64_t K,
                    int64_t empty_every = 0) {
  int64_t T = 0;
  for (int64_t l : lengths) T += l;
  Tensor t = Tensor::empty({T, K}, DType::I32);
  int32_t* p = t.i32();
  int64_t b = 0;
  for (int64_t l : lengths) {
    for (int64_t r = b; r < b + l; ++r)
      for (int64_t j = 0; j < K; ++j) {
        int32_t v = static_cast<int32_t>(b + rng.below(r - b + 1));
        if (rng.uniform() < 0.2 || (empty_every && r % empty_every == 3)) v = -1;
        p[r * K + j] = v;
      }
    b += l;
  }
  return t;
}

void check_scores(const char* name, const ops::IndexerParams& p, Tensor table, uint64_t seed,
                  Rng& rng) {
  const int64_t T = p.tokens, H = p.heads, D = p.head_dim, K = p.kmax;
  std::vector<In> ins = {{randn(rng, {T, H, D})},
                         {randn(rng, {T, D})},
                         {randn(rng, {T, H})},
                         {table, false},
                         {randn(rng, {T, K}), false}};
  run_case(
      name, ins, {"scores", "dq", "dk", "dw"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType dt = in[0].dtype();
        Tensor s = out(c, {T, K}, DType::F32);
        OP(indexer_scores_forward)(c, p, in[0], in[1], in[2], in[3], s);
        Tensor dq = out(c, in[0].shape(), dt), dk = out(c, in[1].shape(), dt),
               dw = out(c, in[2].shape(), dt);
        OP(indexer_scores_backward)(c, p, in[0], in[1], in[2], in[3], in[4], dq, dk, dw);
        return {s, dq, dk, dw};
      },
      seed);
}

TEST(CudaIndexer, ScoresDenseCausal) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_scores("scores dense", {.tokens = 67, .heads = 4, .head_dim = 12, .kmax = 37},
               causal_table({30, 37}, 37), seed, rng);
}

TEST(CudaIndexer, ScoresSparseWithEmptyRows) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_scores("scores sparse", {.tokens = 67, .heads = 3, .head_dim = 9, .kmax = 16},
               random_table(rng, {40, 27}, 16, 17), seed, rng);
}

TEST(CudaIndexer, ScoresLarger) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_scores("scores larger", {.tokens = 1000, .heads = 8, .head_dim = 64, .kmax = 64},
               random_table(rng, {700, 300}, 64), seed, rng);
}

// The GPU's selection equals the CPU's exactly.
void check_topk(const char* name, const Tensor& scores, const Tensor& cand, int64_t topk) {
  SCOPED_TRACE(name);
  const int64_t T = cand.dim(0);
  Context cpu(ContextOptions{.threads = 2});
  Tensor want = Tensor::empty({T, topk}, DType::I32);
  ops::topk_select(cpu, scores, cand, topk, want);
  Context gpu(ContextOptions{.device = Device::CUDA});
  Tensor got = Tensor::empty({T, topk}, DType::I32, Device::CUDA);
  ops::topk_select(gpu, like(gpu, scores), like(gpu, cand), topk, got);
  gpu.synchronize();
  const Tensor h = got.to(Device::CPU);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < want.numel(); ++i)
    if (h.i32()[i] != want.i32()[i]) {
      if (first < 0) first = i;
      ++bad;
    }
  EXPECT_EQ(bad, 0) << "first difference at row " << first / topk << " slot " << first % topk;
}

// Few distinct values (with both signs of zero) make ties common: the lower position must win.
Tensor tied_scores(Rng& rng, Shape s) {
  Tensor t = Tensor::empty(std::move(s));
  const float vals[] = {0.f, -0.f, 1.f, -2.5f};
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = vals[rng.below(4)];
  return t;
}

TEST(CudaIndexer, TopkMatchesTheCpuExactly) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  const Tensor causal = causal_table({30, 37}, 37);
  check_topk("smaller than available", randn(rng, {67, 37}), causal, 16);
  check_topk("ties", tied_scores(rng, {67, 37}), causal, 16);
  check_topk("larger than available", randn(rng, {67, 37}), causal, 80);
  check_topk("one", tied_scores(rng, {67, 37}), causal, 1);
  const Tensor sparse = random_table(rng, {40, 27}, 24, 11);  // duplicates, -1, empty rows
  check_topk("sparse candidates", randn(rng, {67, 24}), sparse, 8);
  check_topk("sparse candidates, ties", tied_scores(rng, {67, 24}), sparse, 8);
  const Tensor big = causal_table({600, 400}, 600);
  check_topk("larger", randn(rng, {1000, 600}), big, 64);
  check_topk("larger, ties", tied_scores(rng, {1000, 600}), big, 64);
}

TEST(CudaIndexer, TopkLongContext) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  const Tensor cand = causal_table({8192}, 8192);
  check_topk("T=8192 k=2048", randn(rng, {8192, 8192}), cand, 2048);
}

void check_kl(const char* name, Tensor table, uint64_t seed, Rng& rng) {
  const int64_t T = table.dim(0), K = table.dim(1);
  Tensor target = Tensor::empty({T, K});
  for (int64_t i = 0; i < target.numel(); ++i)
    target.f32()[i] = static_cast<float>(rng.uniform(0.0, 3.0));
  for (int64_t t = 5; t < T; t += 23)  // rows with a zero target contribute nothing
    for (int64_t j = 0; j < K; ++j) target.f32()[t * K + j] = 0.f;
  std::vector<In> ins = {{randn(rng, {T, K}, 2.0), false}, {target, false}, {table, false}};
  const double dloss = 0.7;
  run_case(
      name, ins, {"softmax", "loss", "dscores"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor sm = out(c, {T, K}, DType::F32), ds = out(c, {T, K}, DType::F32);
        Tensor kl = out(c, {1}, DType::F64);
        OP(indexer_kl_forward)(c, in[0], in[1], in[2], sm, kl);
        Tensor loss = Tensor::empty({1});
        loss.f32()[0] = static_cast<float>(read_scalar(kl));
        OP(indexer_kl_backward)(c, sm, in[1], in[2], dloss, ds);
        return {sm, like(c, loss), ds};
      },
      seed);
}

TEST(CudaIndexer, KlLoss) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_kl("kl dense", causal_table({30, 37}, 37), seed, rng);
  check_kl("kl sparse", random_table(rng, {40, 27}, 16, 11), seed, rng);
  check_kl("kl larger", random_table(rng, {700, 300}, 64), seed, rng);
}

}  // namespace
}  // namespace mt::test
