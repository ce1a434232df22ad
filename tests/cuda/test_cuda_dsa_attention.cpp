// Attention over index lists on tensor cores (ops/cuda/dsa_sparse_attention.cu: query heads
// sharing a key head in groups of 16 to 64) against the CPU op, forward and backward, through the
// harness's three passes (harness/gpu_check.h): the bf16 pass runs the tensor-core kernels and
// must stay within the bf16 row of the tolerance table, the f32 pass the direct kernels. Lists as
// the DSA selection writes them (increasing positions, -1 after a short row's causal keys) and
// scattered ones with duplicates and unused slots; varlen documents; lists not a multiple of the
// 32-slot tile; padded head dims. Without a GPU every test skips, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "harness/gpu_check.h"
#include "ops/attention.h"

namespace mt::test {
namespace {

// Each row: up to K distinct positions of its own document up to itself (always itself, so no
// row is empty), in increasing order, then -1; `scatter`: unordered, with duplicates and -1 slots.
Tensor selection_table(Rng& rng, const std::vector<int64_t>& lengths, int64_t K, bool scatter) {
  int64_t T = 0;
  for (int64_t l : lengths) T += l;
  Tensor t = Tensor::empty({T, K}, DType::I32);
  int32_t* p = t.i32();
  int64_t b = 0;
  for (int64_t l : lengths) {
    for (int64_t r = b; r < b + l; ++r) {
      int32_t* row = p + r * K;
      std::vector<int32_t> pick = {static_cast<int32_t>(r)};
      for (int64_t s = b; s < r; ++s)
        if (rng.uniform() < static_cast<double>(K) / static_cast<double>(r - b + 1))
          pick.push_back(static_cast<int32_t>(s));
      if (scatter)
        for (int64_t j = 1; j < K; ++j)
          pick.push_back(rng.uniform() < 0.2 ? -1 : static_cast<int32_t>(b + rng.below(r - b + 1)));
      pick.resize(std::min<size_t>(pick.size(), static_cast<size_t>(K)), -1);
      if (!scatter) std::sort(pick.begin(), pick.end());
      for (int64_t j = 0; j < K; ++j)
        row[j] = j < static_cast<int64_t>(pick.size()) ? pick[static_cast<size_t>(j)] : -1;
    }
    b += l;
  }
  return t;
}

void check_sparse(const char* name, int64_t H, int64_t Hk, int64_t Dk, int64_t Dv, int64_t K,
                  const std::vector<int64_t>& lengths, bool scatter, uint64_t seed, Rng& rng) {
  ASSERT_TRUE(ops::sparse_attention_fits(H, Hk, Dk, Dv)) << name;
  const Tensor table = selection_table(rng, lengths, K, scatter);
  const int64_t T = table.dim(0);
  const ops::AttentionParams p{.tokens = T,
                               .heads = H,
                               .kv_heads = Hk,
                               .qk_dim = Dk,
                               .v_dim = Dv,
                               .kmax = K,
                               .scale = 1.f / std::sqrt(static_cast<float>(Dk))};
  std::vector<In> ins = {{randn(rng, {T, H, Dk}, 1.5)},
                         {randn(rng, {T, Hk, Dk})},
                         {randn(rng, {T, Hk, Dv})},
                         {table, false},
                         {randn(rng, {T, H, Dv})}};
  run_case(
      name, ins, {"o", "lse", "dq", "dk", "dv"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType dt = in[0].dtype();
        Tensor o = out(c, {T, H, Dv}, dt), lse = out(c, {T, H}, DType::F32);
        OP(attention_forward)(c, p, in[0], in[1], in[2], in[3], o, lse);
        Tensor dq = out(c, in[0].shape(), dt), dk = out(c, in[1].shape(), dt),
               dv = out(c, in[2].shape(), dt);
        OP(attention_backward)(c, p, in[0], in[1], in[2], in[3], o, lse, in[4], dq, dk, dv);
        return {o, lse, dq, dk, dv};
      },
      // A key's gradient sums over every (query, head) that lists it.
      seed, T* H);
}

// The benchmark layer's widths with one shared key head (MQA: 32 heads, 192 / 128).
TEST(CudaDsaAttention, SharedKeyHead32Heads) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_sparse("mqa 32 x 192/128", 32, 1, 192, 128, 64, {170, 130}, false, seed, rng);
  check_sparse("mqa 32 x 192/128, scattered", 32, 1, 192, 128, 64, {300}, true, seed, rng);
}

TEST(CudaDsaAttention, GroupsOf16And64PaddedDims) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  // 50 slots: one full tile and a partial one; 40 / 24 pad to 64 / 64.
  check_sparse("two key heads of 16", 32, 2, 40, 24, 50, {90, 1, 60}, true, seed, rng);
  check_sparse("64 heads on one key, 128/128", 64, 1, 128, 128, 96, {150}, false, seed, rng);
  // 13 / 7: odd widths, staged element by element, odd rows added one float at a time.
  check_sparse("48 heads, odd dims", 48, 1, 13, 7, 33, {80, 45}, true, seed, rng);
}

TEST(CudaDsaAttention, LargerSelection) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_sparse("T=1000 k=256", 32, 1, 192, 128, 256, {700, 300}, false, seed, rng);
}

}  // namespace
}  // namespace mt::test
