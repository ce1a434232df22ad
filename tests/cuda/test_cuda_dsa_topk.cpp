// The fused lightning indexer + top-k (ops/cuda/dsa_indexer_topk.cu) against the CPU's selection
// over the causal score table: the index lists must be equal, element for element. Inputs are
// drawn on a coarse grid (q, k multiples of 1/8 up to 15/8, w multiples of 1/16) so that every
// score is exact in fp32 whatever the summation order: the tensor cores' sums and the CPU's
// loops give the same scores, equal scores are truly equal, and the tie rule (the lower position
// wins) is tested exactly. Varlen batches, T not a multiple of the 64-query tile, padded head
// dims, rows with fewer causal keys than top-k, and T = 8192 with top-2048. Without a GPU every
// test skips, saying so.
#include <gtest/gtest.h>

#include <cmath>

#include "core/seq_info.h"
#include "harness/gpu_check.h"
#include "ops/indexer.h"

namespace mt::test {
namespace {

// Multiples of 1 / den in [-lim, lim] / den: exact in bf16 and in every fp32 sum the op forms.
Tensor grid(Rng& rng, Shape s, int lim, float den) {
  Tensor t = Tensor::empty(std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = static_cast<float>(rng.below(2 * lim + 1) - lim) / den;
  return t;
}

Tensor to_device(const Tensor& host, DType dt) {
  Tensor d = Tensor::empty(host.shape(), dt, Device::CUDA);
  d.copy_from(host);
  return d;
}

struct Case {
  std::vector<int64_t> lengths;
  int64_t heads, head_dim, topk;
  int w_lim = 15;  // |w| up to w_lim / 16
  bool w_positive = false;
};

// Returns the number of rows whose list differs.
int64_t compare(const char* name, const Case& cs, Rng& rng, DType dt = DType::BF16) {
  SCOPED_TRACE(name);
  const SeqInfo seq = SeqInfo::from_lengths(cs.lengths);
  const int64_t T = seq.tokens, H = cs.heads, D = cs.head_dim, K = cs.topk;
  const Tensor q = grid(rng, {T, H, D}, 15, 8.f), k = grid(rng, {T, D}, 15, 8.f);
  Tensor w = grid(rng, {T, H}, cs.w_lim, 16.f);
  if (cs.w_positive)
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = std::fabs(w.f32()[i]) + 1.f / 16;
  // A power-of-two scale keeps the scaled scores exact too.
  const ops::IndexerParams p{.tokens = T, .heads = H, .head_dim = D, .scale = 0.125f};

  Context cpu(ContextOptions{.threads = 4, .workspace_bytes = size_t(2) << 30});
  Tensor want = Tensor::empty({T, K}, DType::I32);
  ops::indexer_causal_topk(cpu, p, seq, q, k, w, K, want);

  Context gpu(ContextOptions{.device = Device::CUDA});
  SeqInfo dseq = seq;
  dseq.cu_seqlens = seq.cu_seqlens.to(Device::CUDA);
  dseq.positions = seq.positions.to(Device::CUDA);
  // Poisoned, so that a slot left unwritten shows.
  Tensor poison = Tensor::empty({T, K}, DType::I32);
  for (int64_t i = 0; i < poison.numel(); ++i) poison.i32()[i] = 0x7eadbeef;
  Tensor got = poison.to(Device::CUDA);
  ops::indexer_causal_topk(gpu, p, dseq, to_device(q, dt), to_device(k, dt), to_device(w, dt), K,
                           got);
  gpu.synchronize();
  const Tensor h = got.to(Device::CPU);
  int64_t bad_rows = 0, first = -1;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      if (h.i32()[t * K + j] != want.i32()[t * K + j]) {
        if (first < 0) first = t * K + j;
        ++bad_rows;
        break;
      }
  EXPECT_EQ(bad_rows, 0) << "first difference at row " << first / K << " slot " << first % K
                         << ": got " << h.i32()[first < 0 ? 0 : first] << ", want "
                         << want.i32()[first < 0 ? 0 : first];
  return bad_rows;
}

TEST(CudaDsaTopk, FusedMatchesTheCpuSelection) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  // The benchmark layer's indexer (8 heads x 64); three documents, one of a single token, T not a
  // multiple of 64; rows before position 64 take every causal key.
  compare("8 x 64, varlen", {.lengths = {700, 1, 299}, .heads = 8, .head_dim = 64, .topk = 64},
          rng);
  // Short documents only: every row takes all of its keys.
  compare("all rows dense", {.lengths = {5, 64, 62}, .heads = 8, .head_dim = 64, .topk = 64}, rng);
  compare("top-1", {.lengths = {130, 67}, .heads = 4, .head_dim = 64, .topk = 1}, rng);
}

TEST(CudaDsaTopk, PaddedHeadDims) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  compare("4 x 128", {.lengths = {333, 190}, .heads = 4, .head_dim = 128, .topk = 48}, rng);
  compare("3 x 40 (padded to 64)", {.lengths = {300}, .heads = 3, .head_dim = 40, .topk = 32}, rng);
  // 36 is not a multiple of 8: the rows are staged element by element.
  compare("2 x 36, unaligned rows", {.lengths = {77, 200}, .heads = 2, .head_dim = 36, .topk = 20},
          rng);
  compare("6 x 100 (padded to 128)", {.lengths = {257}, .heads = 6, .head_dim = 100, .topk = 100},
          rng);
}

// One or two indexer heads with positive weights: ReLU makes every key whose q . k <= 0 score
// exactly 0 (and -0 where the weight's sign flips), so rows tie on many keys and the lower
// positions must win, as on the CPU.
TEST(CudaDsaTopk, ReluZeroTiesGoToTheLowerPosition) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  compare("one head",
          {.lengths = {400, 211}, .heads = 1, .head_dim = 64, .topk = 100, .w_positive = true},
          rng);
  compare("two heads",
          {.lengths = {611}, .heads = 2, .head_dim = 64, .topk = 200, .w_positive = true}, rng);
  // Weights of both signs on one head: negative scores, -0 and +0 all occur.
  compare("one head, signed weights",
          {.lengths = {500}, .heads = 1, .head_dim = 64, .topk = 150, .w_lim = 2}, rng);
}

// Shapes the fused kernel does not take run the composite on the GPU, with the same result.
TEST(CudaDsaTopk, FallbackPathsMatchToo) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  compare("f32 tensors", {.lengths = {150, 90}, .heads = 4, .head_dim = 64, .topk = 32}, rng,
          DType::F32);
  compare("head dim past 128", {.lengths = {150, 70}, .heads = 3, .head_dim = 160, .topk = 24},
          rng);
}

// Heads whose q rows do not all fit the shared memory are staged a slice at a time per key tile
// (IndexerTopkTile::resident_heads): DeepSeek-V3.2's 64 x 128 six at a time (the last slice four),
// 13 x 128 in slices of 7 and 6, 64 x 64 fourteen at a time; the result is the CPU's selection
// all the same.
TEST(CudaDsaTopk, StagedHeadSlices) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  ASSERT_EQ(ops::IndexerTopkTile::resident_heads(64, 128), 6);
  ASSERT_EQ(ops::IndexerTopkTile::resident_heads(13, 128), 7);
  ASSERT_EQ(ops::IndexerTopkTile::resident_heads(64, 64), 14);
  ASSERT_EQ(ops::IndexerTopkTile::resident_heads(8, 64), 8);
  compare("64 x 128", {.lengths = {200}, .heads = 64, .head_dim = 128, .topk = 32}, rng);
  compare("64 x 128 varlen, many tiles",
          {.lengths = {450, 1, 329}, .heads = 64, .head_dim = 128, .topk = 100}, rng);
  compare("13 x 128, a partial slice", {.lengths = {390}, .heads = 13, .head_dim = 128, .topk = 70},
          rng);
  compare("64 x 64", {.lengths = {300, 77}, .heads = 64, .head_dim = 64, .topk = 50}, rng);
  compare("64 x 128, weights of three values",
          {.lengths = {260}, .heads = 64, .head_dim = 128, .topk = 40, .w_lim = 1}, rng);
}

// The layer's sizes: top-2048 of up to 8192 causal keys per row.
TEST(CudaDsaTopk, LongContextTopk2048) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  compare("T=8192 k=2048", {.lengths = {8192}, .heads = 8, .head_dim = 64, .topk = 2048}, rng);
  compare("T=6000 in two documents",
          {.lengths = {3000, 3000}, .heads = 8, .head_dim = 64, .topk = 2048}, rng);
}

}  // namespace
}  // namespace mt::test
