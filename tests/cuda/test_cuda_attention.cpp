// Attention over index lists on the GPU against the CPU engine (harness/gpu_check.h): dense causal
// tables of packed documents, sparse random lists with unused slots and duplicates, shared (MQA)
// and grouped key heads, the head-summed probabilities, a larger case, a long-context one, and the
// backward's repeatability. Without a GPU every test skips, saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/seq_info.h"
#include "harness/gpu_check.h"
#include "ops/attention.h"

namespace mt::test {
namespace {

ops::AttentionParams params(int64_t T, int64_t H, int64_t Hk, int64_t Dk, int64_t Dv, int64_t K) {
  return {.tokens = T,
          .heads = H,
          .kv_heads = Hk,
          .qk_dim = Dk,
          .v_dim = Dv,
          .kmax = K,
          .scale = 1.f / std::sqrt(static_cast<float>(Dk))};
}

Tensor causal_table(const std::vector<int64_t>& lengths, int64_t K) {
  const SeqInfo seq = SeqInfo::from_lengths(lengths);
  Tensor t = Tensor::empty({seq.tokens, K}, DType::I32);
  ops::causal_indices(seq, t);
  return t;
}

// Random positions of each row's own document up to t: -1 slots, duplicates, and the row itself
// in slot 0 so that no row is empty (an empty row's lse is -inf; tests/ops covers it).
Tensor random_table(Rng& rng, const std::vector<int64_t>& lengths, int64_t K) {
  int64_t T = 0;
  for (int64_t l : lengths) T += l;
  Tensor t = Tensor::empty({T, K}, DType::I32);
  int32_t* p = t.i32();
  int64_t b = 0;
  for (int64_t l : lengths) {
    for (int64_t r = b; r < b + l; ++r)
      for (int64_t j = 0; j < K; ++j) {
        int32_t v = static_cast<int32_t>(b + rng.below(r - b + 1));
        if (rng.uniform() < 0.2) v = -1;
        p[r * K + j] = j == 0 ? static_cast<int32_t>(r) : v;
      }
    b += l;
  }
  return t;
}

void check_attention(const char* name, const ops::AttentionParams& p, Tensor table, uint64_t seed,
                     Rng& rng) {
  const int64_t T = p.tokens, H = p.heads, Hk = p.kvh();
  std::vector<In> ins = {{randn(rng, {T, H, p.qk_dim}, 1.5)},
                         {randn(rng, {T, Hk, p.qk_dim})},
                         {randn(rng, {T, Hk, p.v_dim})},
                         {table, false},
                         {randn(rng, {T, H, p.v_dim})}};
  run_case(
      name, ins, {"o", "lse", "dq", "dk", "dv"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType dt = in[0].dtype();
        Tensor o = out(c, {T, H, p.v_dim}, dt), lse = out(c, {T, H}, DType::F32);
        OP(attention_forward)(c, p, in[0], in[1], in[2], in[3], o, lse);
        Tensor dq = out(c, in[0].shape(), dt), dk = out(c, in[1].shape(), dt),
               dv = out(c, in[2].shape(), dt);
        OP(attention_backward)(c, p, in[0], in[1], in[2], in[3], o, lse, in[4], dq, dk, dv);
        return {o, lse, dq, dk, dv};
      },
      // dk and dv sum over every (query, head) that selected the key.
      seed, T* H);
}

TEST(CudaAttention, DenseCausalTwoDocuments) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_attention("dense causal", params(67, 3, 3, 13, 11, 37), causal_table({30, 37}, 37), seed,
                  rng);
}

TEST(CudaAttention, SparseRandomLists) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_attention("sparse", params(67, 2, 2, 9, 7, 16), random_table(rng, {40, 27}, 16), seed, rng);
}

TEST(CudaAttention, SharedKeyHead) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_attention("mqa", params(45, 4, 1, 10, 6, 12), random_table(rng, {45}, 12), seed, rng);
}

TEST(CudaAttention, GroupedKeyHeadsPaddedTable) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_attention("gqa", params(29, 4, 2, 5, 8, 40), causal_table({12, 17}, 40), seed, rng);
}

TEST(CudaAttention, LargerSparseVarlen) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_attention("larger sparse", params(1000, 4, 4, 48, 32, 64),
                  random_table(rng, {600, 17, 383}, 64), seed, rng);
  check_attention("larger mla-like", params(1000, 8, 1, 72, 64, 64), random_table(rng, {1000}, 64),
                  seed, rng);
}

TEST(CudaAttention, LargerDenseCausal) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_attention("larger dense", params(1000, 2, 2, 32, 32, 700), causal_table({300, 700}, 700),
                  seed, rng);
}

// The sizes the brief asks the direct kernels to handle: T = 8192 with 2048 slots per row.
TEST(CudaAttention, LongContextTopk2048) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_attention("long context", params(8192, 2, 1, 32, 16, 2048),
                  random_table(rng, {5000, 3192}, 2048), seed, rng);
}

TEST(CudaAttention, HeadSummedProbabilities) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  for (const auto& [p, lengths] :
       {std::pair{params(67, 3, 3, 8, 5, 16), std::vector<int64_t>{30, 37}},
        std::pair{params(1000, 4, 1, 40, 8, 64), std::vector<int64_t>{999, 1}}}) {
    const int64_t T = p.tokens;
    std::vector<In> ins = {{randn(rng, {T, p.heads, p.qk_dim}, 1.5)},
                           {randn(rng, {T, p.kvh(), p.qk_dim})},
                           {randn(rng, {T, p.kvh(), p.v_dim})},
                           {random_table(rng, lengths, p.kmax), false}};
    run_case(
        "prob_sum", ins, {"prob_sum"},
        [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
          Tensor o = out(c, {T, p.heads, p.v_dim}, in[0].dtype()),
                 lse = out(c, {T, p.heads}, DType::F32), s = out(c, {T, p.kmax}, DType::F32);
          OP(attention_forward)(c, p, in[0], in[1], in[2], in[3], o, lse);
          OP(attention_prob_sum)(c, p, in[0], in[1], in[3], lse, s);
          return {s};
        },
        seed);
  }
}

TEST(CudaAttention, CausalIndicesMatchTheCpu) {
  REQUIRE_GPU();
  const SeqInfo seq = SeqInfo::from_lengths({5, 1, 30, 14});
  Tensor want = Tensor::empty({seq.tokens, 33}, DType::I32);
  ops::causal_indices(seq, want);
  Tensor got = Tensor::empty({seq.tokens, 33}, DType::I32, Device::CUDA);
  ops::causal_indices(seq, got);
  const Tensor h = got.to(Device::CPU);
  EXPECT_EQ(std::memcmp(h.raw(), want.raw(), want.bytes()), 0);
}

// Dense causal attention without lists: bf16 runs the tensor-core kernels (flash_attention.cu)
// where flash_attention_fits holds, f32 and other shapes the direct kernels over causal ranges.
void check_causal(const char* name, const ops::AttentionParams& p,
                  const std::vector<int64_t>& lengths, uint64_t seed, Rng& rng) {
  const int64_t T = p.tokens, H = p.heads, Hk = p.kvh();
  std::vector<In> ins = {{randn(rng, {T, H, p.qk_dim}, 1.5)},
                         {randn(rng, {T, Hk, p.qk_dim})},
                         {randn(rng, {T, Hk, p.v_dim})},
                         {SeqInfo::from_lengths(lengths).cu_seqlens, false},
                         {randn(rng, {T, H, p.v_dim})}};
  run_case(
      name, ins, {"o", "lse", "dq", "dk", "dv"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType dt = in[0].dtype();
        Tensor o = out(c, {T, H, p.v_dim}, dt), lse = out(c, {T, H}, DType::F32);
        OP(causal_attention_forward)(c, p, in[3], in[0], in[1], in[2], o, lse);
        Tensor dq = out(c, in[0].shape(), dt), dk = out(c, in[1].shape(), dt),
               dv = out(c, in[2].shape(), dt);
        OP(causal_attention_backward)(c, p, in[3], in[0], in[1], in[2], o, lse, in[4], dq, dk, dv);
        return {o, lse, dq, dk, dv};
      },
      seed, T* H);
}

TEST(CudaAttention, CausalMlaWidthsPackedDocuments) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_causal("causal 192/128", params(700, 2, 2, 192, 128, 0), {300, 1, 399}, seed, rng);
}

TEST(CudaAttention, CausalPaddedHeadDims) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  // Widths that are not multiples of 8 (element-wise tile loads) and of 16 (zero padding).
  check_causal("causal 13/11", params(67, 3, 3, 13, 11, 0), {30, 37}, seed, rng);
  check_causal("causal 72/64", params(1000, 2, 2, 72, 64, 0), {1000}, seed, rng);
  check_causal("causal 128/128", params(333, 2, 2, 128, 128, 0), {64, 65, 204}, seed, rng);
}

TEST(CudaAttention, CausalDirectShapes) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_causal("causal gqa", params(129, 4, 2, 24, 16, 0), {100, 29}, seed, rng);
  check_causal("causal wide", params(150, 2, 2, 256, 64, 0), {150}, seed, rng);
}

TEST(CudaAttention, CausalLongDocument) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_causal("causal 4096", params(4096, 2, 2, 192, 128, 0), {4000, 96}, seed, rng);
}

// The tensor-core backward writes each gradient row from one block, in a fixed order.
TEST(CudaAttention, CausalFlashBackwardIsBitRepeatable) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  const int64_t T = 500, H = 3;
  const ops::AttentionParams p = params(T, H, H, 192, 128, 0);
  Context ctx(ContextOptions{.device = Device::CUDA, .seed = seed});
  auto bf = [&](const Tensor& host) {
    Tensor d = out(ctx, host.shape(), DType::BF16);
    d.copy_from(host);
    return d;
  };
  Tensor q = bf(randn(rng, {T, H, 192})), k = bf(randn(rng, {T, H, 192})),
         v = bf(randn(rng, {T, H, 128})), dout = bf(randn(rng, {T, H, 128}));
  Tensor cu = like(ctx, SeqInfo::from_lengths({200, 300}).cu_seqlens);
  Tensor o = out(ctx, {T, H, 128}, DType::BF16), lse = out(ctx, {T, H}, DType::F32);
  ops::causal_attention_forward(ctx, p, cu, q, k, v, o, lse);
  Tensor dq[2], dk[2], dv[2];
  for (int i = 0; i < 2; ++i) {
    dq[i] = out(ctx, q.shape(), DType::BF16);
    dk[i] = out(ctx, k.shape(), DType::BF16);
    dv[i] = out(ctx, v.shape(), DType::BF16);
    ops::causal_attention_backward(ctx, p, cu, q, k, v, o, lse, dout, dq[i], dk[i], dv[i]);
  }
  ctx.synchronize();
  for (Tensor* g : {dq, dk, dv}) {
    const Tensor a = g[0].to(Device::CPU), b = g[1].to(Device::CPU);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0);
  }
}

// dk and dv are gathered in slot order per key (no float atomics): two runs agree bit for bit.
TEST(CudaAttention, BackwardIsBitRepeatable) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  const ops::AttentionParams p = params(300, 4, 1, 24, 16, 64);
  Context ctx(ContextOptions{.device = Device::CUDA, .seed = seed});
  Tensor q = like(ctx, randn(rng, {300, 4, 24})), k = like(ctx, randn(rng, {300, 1, 24})),
         v = like(ctx, randn(rng, {300, 1, 16})), dout = like(ctx, randn(rng, {300, 4, 16})),
         idx = like(ctx, random_table(rng, {300}, 64));
  Tensor o = out(ctx, {300, 4, 16}, DType::F32), lse = out(ctx, {300, 4}, DType::F32);
  ops::attention_forward(ctx, p, q, k, v, idx, o, lse);
  Tensor dq[2], dk[2], dv[2];
  for (int i = 0; i < 2; ++i) {
    dq[i] = out(ctx, q.shape(), DType::F32);
    dk[i] = out(ctx, k.shape(), DType::F32);
    dv[i] = out(ctx, v.shape(), DType::F32);
    ops::attention_backward(ctx, p, q, k, v, idx, o, lse, dout, dq[i], dk[i], dv[i]);
  }
  ctx.synchronize();
  for (Tensor* g : {dq, dk, dv}) {
    const Tensor a = g[0].to(Device::CPU), b = g[1].to(Device::CPU);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0);
  }
}

}  // namespace
}  // namespace mt::test
