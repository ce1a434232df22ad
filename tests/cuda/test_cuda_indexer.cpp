// The lightning indexer on the GPU against the CPU engine: scores and their gradients on dense and
// sparse tables, top-k selection (integer outputs must match exactly, ties going to the lower
// position, duplicates and unused slots in the candidates, a long context), and the KL loss with
// its gradient. Without a GPU every test skips, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

// The DSA layer's table after the selection: per row min(K, causal keys) distinct positions of its
// document in increasing order (a random subset where there are more), then -1.
Tensor selection_table(Rng& rng, const std::vector<int64_t>& lengths, int64_t K) {
  int64_t T = 0;
  for (int64_t l : lengths) T += l;
  Tensor t = Tensor::empty({T, K}, DType::I32);
  int32_t* p = t.i32();
  std::vector<int32_t> pool;
  int64_t b = 0;
  for (int64_t l : lengths) {
    for (int64_t r = b; r < b + l; ++r) {
      pool.clear();
      for (int64_t s = b; s <= r; ++s) pool.push_back(static_cast<int32_t>(s));
      const int64_t n = std::min<int64_t>(K, static_cast<int64_t>(pool.size()));
      for (int64_t i = 0; i < n; ++i)
        std::swap(pool[i], pool[i + rng.below(static_cast<int64_t>(pool.size()) - i)]);
      std::sort(pool.begin(), pool.begin() + n);
      for (int64_t j = 0; j < K; ++j) p[r * K + j] = j < n ? pool[j] : -1;
    }
    b += l;
  }
  return t;
}

// `zero_every` > 0 zeroes every such (query, head) q row and key row, so that q . k is exactly 0
// (ReLU's tie: no score, no gradient) on both devices.
void check_scores(const char* name, const ops::IndexerParams& p, Tensor table, uint64_t seed,
                  Rng& rng, int64_t zero_every = 0) {
  const int64_t T = p.tokens, H = p.heads, D = p.head_dim, K = p.kmax;
  Tensor q = randn(rng, {T, H, D}), k = randn(rng, {T, D});
  // On a grid of 1/8 (|x| <= 4, exact in bf16) every q . k is a multiple of 1/64 below 2^11 and
  // so exact in fp32 whatever the summation order: the GPU and the CPU take the same ReLU branch
  // for every (query, head, slot). Random reals put some of the millions of dot products within
  // rounding of 0, where the branch taken is the order's, and one flipped term exceeds the f32
  // bound (seen: 1.6e-4 at the benchmark shape).
  for (Tensor* t : {&q, &k})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->f32()[i] = std::clamp(std::round(t->f32()[i] * 8.f), -32.f, 32.f) / 8.f;
  if (zero_every > 0) {
    for (int64_t r = 0; r < T * H; r += zero_every)
      for (int64_t d = 0; d < D; ++d) q.f32()[r * D + d] = 0.f;
    for (int64_t s = 1; s < T; s += zero_every)
      for (int64_t d = 0; d < D; ++d) k.f32()[s * D + d] = 0.f;
  }
  std::vector<In> ins = {
      {q}, {k}, {randn(rng, {T, H})}, {table, false}, {randn(rng, {T, K}), false}};
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

// bf16 with up to 64 heads of 64 or 128 dims runs the tensor-core kernels (indexer_tc.cu): the
// benchmark layer's shape on the selection's tables, DeepSeek-V3.2's 64 x 128, head counts off the
// 16-row MMA groups, tables off the 64-slot tile, unused slots, varlen, and exact ReLU zeros.
TEST(CudaIndexer, ScoresTensorCoreBenchShape) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_scores("tc 8x64 top-2048", {.tokens = 3000, .heads = 8, .head_dim = 64, .kmax = 2048},
               selection_table(rng, {3000}, 2048), seed, rng);
}

TEST(CudaIndexer, ScoresTensorCoreOddShapes) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_scores("tc 64x128 varlen", {.tokens = 301, .heads = 64, .head_dim = 128, .kmax = 200},
               selection_table(rng, {150, 151}, 200), seed, rng);
  check_scores("tc 24x128 sparse", {.tokens = 333, .heads = 24, .head_dim = 128, .kmax = 77},
               random_table(rng, {200, 133}, 77, 19), seed, rng);
  check_scores("tc 5x64 sparse", {.tokens = 190, .heads = 5, .head_dim = 64, .kmax = 130},
               random_table(rng, {100, 1, 89}, 130, 13), seed, rng);
  check_scores("tc 17x64 selection", {.tokens = 257, .heads = 17, .head_dim = 64, .kmax = 64},
               selection_table(rng, {257}, 64), seed, rng);
}

TEST(CudaIndexer, ScoresTensorCoreReluTies) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_scores("tc ties 8x64", {.tokens = 500, .heads = 8, .head_dim = 64, .kmax = 128},
               selection_table(rng, {260, 240}, 128), seed, rng, 3);
  check_scores("tc ties 2x128", {.tokens = 300, .heads = 2, .head_dim = 128, .kmax = 96},
               random_table(rng, {300}, 96, 7), seed, rng, 2);
}

// The KL loss from the indexer's inputs in one call (ops::indexer_scores_kl): on the GPU in bf16
// the fused kernel, its row's scores in shared memory, against the CPU's composite; f32 runs the
// composite on the GPU too.
void check_scores_kl(const char* name, const ops::IndexerParams& p, Tensor table, uint64_t seed,
                     Rng& rng) {
  const int64_t T = p.tokens, H = p.heads, D = p.head_dim, K = p.kmax;
  Tensor target = Tensor::empty({T, K});
  for (int64_t i = 0; i < target.numel(); ++i)
    target.f32()[i] = static_cast<float>(rng.uniform(0.0, 3.0));
  for (int64_t t = 5; t < T; t += 23)  // rows with a zero target contribute nothing
    for (int64_t j = 0; j < K; ++j) target.f32()[t * K + j] = 0.f;
  std::vector<In> ins = {{randn(rng, {T, H, D})},
                         {randn(rng, {T, D})},
                         {randn(rng, {T, H}, 0.5)},
                         {table, false},
                         {target, false}};
  const double dloss = 0.7;
  run_case(
      name, ins, {"loss", "dscores", "loss (no gradient)"},
      [&](Context& c, const std::vector<Tensor>& in, bool) -> std::vector<Tensor> {
        Tensor ds = out(c, {T, K}, DType::F32), kl = out(c, {1}, DType::F64),
               kl2 = out(c, {1}, DType::F64), none;
        ops::indexer_scores_kl(c, p, in[0], in[1], in[2], in[3], in[4], dloss, kl, ds);
        ops::indexer_scores_kl(c, p, in[0], in[1], in[2], in[3], in[4], dloss, kl2, none);
        Tensor loss = Tensor::empty({1}), loss2 = Tensor::empty({1});
        loss.f32()[0] = static_cast<float>(read_scalar(kl));
        loss2.f32()[0] = static_cast<float>(read_scalar(kl2));
        return {like(c, loss), ds, like(c, loss2)};
      },
      seed);
}

TEST(CudaIndexer, ScoresKlFused) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_scores_kl("kl fused 8x64 top-2048",
                  {.tokens = 2500, .heads = 8, .head_dim = 64, .kmax = 2048},
                  selection_table(rng, {2500}, 2048), seed, rng);
  check_scores_kl("kl fused 64x128 varlen",
                  {.tokens = 211, .heads = 64, .head_dim = 128, .kmax = 150},
                  selection_table(rng, {100, 111}, 150), seed, rng);
  check_scores_kl("kl fused 3x64 sparse", {.tokens = 190, .heads = 3, .head_dim = 64, .kmax = 70},
                  random_table(rng, {100, 90}, 70, 11), seed, rng);
}

// The backward has one writer per output and a fixed order: two runs agree bit for bit.
TEST(CudaIndexer, ScoresBackwardRepeatable) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  const ops::IndexerParams p{.tokens = 1500, .heads = 8, .head_dim = 64, .kmax = 512};
  Context gpu(ContextOptions{.device = Device::CUDA, .seed = seed});
  auto dev = [&](const Tensor& h) {
    Tensor d = Tensor::empty(h.shape(), DType::BF16, Device::CUDA);
    d.copy_from(h);
    return d;
  };
  const Tensor q = dev(randn(rng, {p.tokens, p.heads, p.head_dim})),
               k = dev(randn(rng, {p.tokens, p.head_dim})),
               w = dev(randn(rng, {p.tokens, p.heads}));
  const Tensor idx = like(gpu, selection_table(rng, {p.tokens}, p.kmax));
  const Tensor g = like(gpu, randn(rng, {p.tokens, p.kmax}));
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 2; ++run) {
    Tensor dq = out(gpu, q.shape(), DType::BF16), dk = out(gpu, k.shape(), DType::BF16),
           dw = out(gpu, w.shape(), DType::BF16);
    ops::indexer_scores_backward(gpu, p, q, k, w, idx, g, dq, dk, dw);
    gpu.synchronize();
    const std::vector<std::vector<uint8_t>> b = {host_bytes(dq), host_bytes(dk), host_bytes(dw)};
    if (run == 0)
      first = b;
    else
      for (size_t i = 0; i < b.size(); ++i) EXPECT_TRUE(b[i] == first[i]) << "output " << i;
  }
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
