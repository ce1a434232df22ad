#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/attention.h"
#include "ref/attention_ref.h"

namespace mt::test {
namespace {

// An index table of `kmax` slots per row: random positions of the row's own document up to t,
// with unused (-1) slots, an occasional duplicate, and every `empty_every`-th row left empty.
std::function<void(Rng&, Tensor&)> random_table(std::vector<int64_t> offsets, int64_t empty_every) {
  return [offsets, empty_every](Rng& rng, Tensor& t) {
    const int64_t T = t.dim(0), K = t.dim(1);
    int32_t* p = t.i32();
    for (size_t d = 0; d + 1 < offsets.size(); ++d)
      for (int64_t r = offsets[d]; r < offsets[d + 1]; ++r)
        for (int64_t j = 0; j < K; ++j) {
          int32_t v = static_cast<int32_t>(offsets[d] + rng.below(r - offsets[d] + 1));
          if (rng.uniform() < 0.2) v = -1;
          if (empty_every && r % empty_every == 3) v = -1;
          p[r * K + j] = v;
        }
    (void)T;
  };
}

std::function<void(Rng&, Tensor&)> causal_table(std::vector<int64_t> lengths) {
  return [lengths](Rng&, Tensor& t) { ops::causal_indices(SeqInfo::from_lengths(lengths), t); };
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> o{0};
  for (int64_t l : lengths) o.push_back(o.back() + l);
  return o;
}

class AttentionCase : public OpCase {
 public:
  AttentionCase(std::string name, ops::AttentionParams p, std::function<void(Rng&, Tensor&)> table)
      : name_(std::move(name)), p_(p), table_(std::move(table)) {}
  std::string name() const override { return name_; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "q", .shape = {p_.tokens, p_.heads, p_.qk_dim}, .scale = 1.5},
            {.name = "k", .shape = {p_.tokens, p_.kvh(), p_.qk_dim}},
            {.name = "v", .shape = {p_.tokens, p_.kvh(), p_.v_dim}},
            {.name = "indices",
             .shape = {p_.tokens, p_.kmax},
             .dtype = DType::I32,
             .differentiable = false,
             .init = table_}};
  }
  // lse of an empty row is -inf; it is reported as 0 here so the norm-wise comparison stays
  // finite, and checked to be -inf directly.
  std::vector<OutputSpec> outputs() const override { return {{"o"}, {"lse", false}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    o_ = alloc({p_.tokens, p_.heads, p_.v_dim});
    lse_ = alloc({p_.tokens, p_.heads});
    ops::attention_forward(ctx, p_, in[0], in[1], in[2], in[3], o_, lse_);
    // Read on the host (copies when the case runs on the GPU).
    ctx.synchronize();
    const Tensor idx_h = in[3].to(Device::CPU), lse_h = lse_.to(Device::CPU);
    Tensor shown_h = Tensor::empty(lse_.shape());
    const int32_t* idx = idx_h.i32();
    for (int64_t t = 0; t < p_.tokens; ++t) {
      bool any = false;
      for (int64_t j = 0; j < p_.kmax; ++j) any |= idx[t * p_.kmax + j] >= 0;
      for (int64_t h = 0; h < p_.heads; ++h) {
        float l = lse_h.f32()[t * p_.heads + h];
        if (!any) {
          EXPECT_EQ(l, -std::numeric_limits<float>::infinity()) << "lse of empty row " << t;
          l = 0.f;
        }
        shown_h.f32()[t * p_.heads + h] = l;
      }
    }
    Tensor shown = alloc(lse_.shape());
    shown.copy_from(shown_h);
    return {o_, shown};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::attention_backward(ctx, p_, in[0], in[1], in[2], in[3], o_, lse_, dout[0], grads[0],
                            grads[1], grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::AttnRefOut r = ref::attention(in[0], in[1], in[2], in[3], p_.tokens, p_.heads, p_.kvh(),
                                       p_.qk_dim, p_.v_dim, p_.kmax, p_.scale);
    for (double& l : r.lse)
      if (!std::isfinite(l)) l = 0;
    return {r.o, r.lse};
  }

 private:
  std::string name_;
  ops::AttentionParams p_;
  std::function<void(Rng&, Tensor&)> table_;
  Tensor o_, lse_;
};

ops::AttentionParams params(int64_t T, int64_t H, int64_t Hk, int64_t Dk, int64_t Dv, int64_t K) {
  return {.tokens = T,
          .heads = H,
          .kv_heads = Hk,
          .qk_dim = Dk,
          .v_dim = Dv,
          .kmax = K,
          .scale = 1.f / std::sqrt(static_cast<float>(Dk))};
}

TEST(Attention, DenseCausalTwoDocuments) {
  AttentionCase c("dense_causal", params(67, 3, 3, 13, 11, 37), causal_table({30, 37}));
  check_op(c);
}

TEST(Attention, SparseIndicesWithEmptyRows) {
  AttentionCase c("sparse", params(67, 2, 2, 9, 7, 16), random_table(offsets_of({40, 27}), 11));
  check_op(c);
}

TEST(Attention, SharedKeyHead) {
  AttentionCase c("mqa", params(45, 4, 1, 10, 6, 12), random_table(offsets_of({45}), 0));
  check_op(c);
}

TEST(Attention, GroupedKeyHeads) {
  AttentionCase c("gqa", params(29, 4, 2, 5, 8, 29), causal_table({12, 17}));
  check_op(c);
}

// Wider tables with extra -1 padding (what top-k >= T produces) give bit-identical results.
TEST(Attention, PaddedTableEqualsDenseExactly) {
  const std::vector<int64_t> lengths{30, 37};
  SeqInfo seq = SeqInfo::from_lengths(lengths);
  const int64_t T = seq.tokens, H = 3, Dk = 12, Dv = 8;
  Context ctx;
  Rng rng(test_seed());
  Tensor q = Tensor::empty({T, H, Dk}), k = Tensor::empty({T, H, Dk}),
         v = Tensor::empty({T, H, Dv});
  fill_normal(rng, q);
  fill_normal(rng, k);
  fill_normal(rng, v);
  Tensor o[2], lse[2], dq[2], dk[2], dv[2];
  Tensor dout = Tensor::empty({T, H, Dv});
  fill_normal(rng, dout);
  const int64_t widths[2] = {ops::max_doc_len(seq), 80};
  for (int i = 0; i < 2; ++i) {
    ops::AttentionParams p = params(T, H, H, Dk, Dv, widths[i]);
    Tensor idx = Tensor::empty({T, widths[i]}, DType::I32);
    ops::causal_indices(seq, idx);
    o[i] = Tensor::empty({T, H, Dv});
    lse[i] = Tensor::empty({T, H});
    dq[i] = Tensor::empty(q.shape());
    dk[i] = Tensor::empty(k.shape());
    dv[i] = Tensor::empty(v.shape());
    ops::attention_forward(ctx, p, q, k, v, idx, o[i], lse[i]);
    ops::attention_backward(ctx, p, q, k, v, idx, o[i], lse[i], dout, dq[i], dk[i], dv[i]);
  }
  EXPECT_EQ(std::memcmp(o[0].raw(), o[1].raw(), o[0].bytes()), 0);
  EXPECT_EQ(std::memcmp(lse[0].raw(), lse[1].raw(), lse[0].bytes()), 0);
  EXPECT_EQ(std::memcmp(dq[0].raw(), dq[1].raw(), dq[0].bytes()), 0);
  EXPECT_EQ(std::memcmp(dk[0].raw(), dk[1].raw(), dk[0].bytes()), 0);
  EXPECT_EQ(std::memcmp(dv[0].raw(), dv[1].raw(), dv[0].bytes()), 0);
}

// Dense causal attention without index lists (ops::causal_attention_*), against the reference
// run over causal index rows that the reference builds itself from the document lengths.
class CausalAttentionCase : public OpCase {
 public:
  CausalAttentionCase(ops::AttentionParams p, std::vector<int64_t> lengths)
      : p_(p), lengths_(std::move(lengths)) {}
  std::string name() const override { return "causal_attention"; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "q", .shape = {p_.tokens, p_.heads, p_.qk_dim}, .scale = 1.5},
            {.name = "k", .shape = {p_.tokens, p_.kvh(), p_.qk_dim}},
            {.name = "v", .shape = {p_.tokens, p_.kvh(), p_.v_dim}}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"o"}, {"lse", false}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    cu_ = on_device(ctx, SeqInfo::from_lengths(lengths_).cu_seqlens);
    o_ = alloc({p_.tokens, p_.heads, p_.v_dim});
    lse_ = alloc({p_.tokens, p_.heads});
    ops::causal_attention_forward(ctx, p_, cu_, in[0], in[1], in[2], o_, lse_);
    return {o_, lse_};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::causal_attention_backward(ctx, p_, cu_, in[0], in[1], in[2], o_, lse_, dout[0], grads[0],
                                   grads[1], grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    const int64_t K = *std::max_element(lengths_.begin(), lengths_.end());
    DVec idx(static_cast<size_t>(p_.tokens * K), -1.0);
    int64_t b = 0;
    for (int64_t l : lengths_) {
      for (int64_t t = b; t < b + l; ++t)
        for (int64_t s = b; s <= t; ++s) idx[static_cast<size_t>(t * K + s - b)] = double(s);
      b += l;
    }
    const ref::AttnRefOut r = ref::attention(in[0], in[1], in[2], idx, p_.tokens, p_.heads,
                                             p_.kvh(), p_.qk_dim, p_.v_dim, K, p_.scale);
    return {r.o, r.lse};
  }

 private:
  ops::AttentionParams p_;
  std::vector<int64_t> lengths_;
  Tensor cu_, o_, lse_;
};

TEST(Attention, CausalWithoutListsPackedDocuments) {
  CausalAttentionCase c(params(67, 3, 3, 13, 11, 0), {30, 1, 36});
  check_op(c);
}

TEST(Attention, CausalWithoutListsGroupedKeyHeads) {
  CausalAttentionCase c(params(41, 4, 2, 6, 9, 0), {41});
  check_op(c);
}

// Without lists and over causal_indices' lists the op computes the same sums in the same order.
TEST(Attention, CausalWithoutListsEqualsTheListsExactly) {
  const SeqInfo seq = SeqInfo::from_lengths({19, 44, 1});
  const int64_t T = seq.tokens, H = 2, Dk = 10, Dv = 7, K = ops::max_doc_len(seq);
  Context ctx;
  const uint64_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  Tensor q = Tensor::empty({T, H, Dk}), k = Tensor::empty({T, H, Dk}),
         v = Tensor::empty({T, H, Dv}), dout = Tensor::empty({T, H, Dv});
  for (Tensor* t : {&q, &k, &v, &dout}) fill_normal(rng, *t);
  Tensor idx = Tensor::empty({T, K}, DType::I32);
  ops::causal_indices(seq, idx);
  Tensor o[2], lse[2], dq[2], dk[2], dv[2];
  for (int i = 0; i < 2; ++i) {
    o[i] = Tensor::empty({T, H, Dv});
    lse[i] = Tensor::empty({T, H});
    dq[i] = Tensor::empty(q.shape());
    dk[i] = Tensor::empty(k.shape());
    dv[i] = Tensor::empty(v.shape());
  }
  const ops::AttentionParams p = params(T, H, H, Dk, Dv, K);
  ops::attention_forward(ctx, p, q, k, v, idx, o[0], lse[0]);
  ops::attention_backward(ctx, p, q, k, v, idx, o[0], lse[0], dout, dq[0], dk[0], dv[0]);
  ops::causal_attention_forward(ctx, p, seq.cu_seqlens, q, k, v, o[1], lse[1]);
  ops::causal_attention_backward(ctx, p, seq.cu_seqlens, q, k, v, o[1], lse[1], dout, dq[1], dk[1],
                                 dv[1]);
  for (Tensor* t : {o, lse, dq, dk, dv})
    EXPECT_EQ(std::memcmp(t[0].raw(), t[1].raw(), t[0].bytes()), 0);
}

TEST(Attention, CausalWithoutListsRejectsBadOffsets) {
  Context ctx;
  const ops::AttentionParams p = params(6, 1, 1, 4, 4, 0);
  Tensor q = Tensor::zeros({6, 1, 4}), k = Tensor::zeros({6, 1, 4}), v = Tensor::zeros({6, 1, 4});
  Tensor o = Tensor::zeros({6, 1, 4}), l = Tensor::zeros({6, 1});
  Tensor short_cu = SeqInfo::from_lengths({2, 3}).cu_seqlens;  // 5 tokens, tensors hold 6
  EXPECT_THROW(ops::causal_attention_forward(ctx, p, short_cu, q, k, v, o, l), ShapeError);
  Tensor no_docs = Tensor::zeros({1}, DType::I32);
  EXPECT_THROW(ops::causal_attention_forward(ctx, p, no_docs, q, k, v, o, l), ShapeError);
}

class ProbSumCase : public OpCase {
 public:
  explicit ProbSumCase(ops::AttentionParams p, std::function<void(Rng&, Tensor&)> table)
      : p_(p), table_(std::move(table)) {}
  std::string name() const override { return "attention_prob_sum"; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "q", .shape = {p_.tokens, p_.heads, p_.qk_dim}, .differentiable = false},
            {.name = "k", .shape = {p_.tokens, p_.kvh(), p_.qk_dim}, .differentiable = false},
            {.name = "v", .shape = {p_.tokens, p_.kvh(), p_.v_dim}, .differentiable = false},
            {.name = "indices",
             .shape = {p_.tokens, p_.kmax},
             .dtype = DType::I32,
             .differentiable = false,
             .init = table_}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"prob_sum", false}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor o = alloc({p_.tokens, p_.heads, p_.v_dim}), lse = alloc({p_.tokens, p_.heads});
    ops::attention_forward(ctx, p_, in[0], in[1], in[2], in[3], o, lse);
    Tensor s = alloc({p_.tokens, p_.kmax});
    ops::attention_prob_sum(ctx, p_, in[0], in[1], in[3], lse, s);
    return {s};
  }
  void backward(Context&, GuardedAlloc&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                std::vector<Tensor>&) override {}
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::AttnRefOut r = ref::attention(in[0], in[1], in[2], in[3], p_.tokens, p_.heads, p_.kvh(),
                                       p_.qk_dim, p_.v_dim, p_.kmax, p_.scale);
    DVec s(static_cast<size_t>(p_.tokens * p_.kmax), 0.0);
    for (int64_t t = 0; t < p_.tokens; ++t)
      for (int64_t h = 0; h < p_.heads; ++h)
        for (int64_t j = 0; j < p_.kmax; ++j)
          s[t * p_.kmax + j] += r.p[(t * p_.heads + h) * p_.kmax + j];
    return {s};
  }

 private:
  ops::AttentionParams p_;
  std::function<void(Rng&, Tensor&)> table_;
};

TEST(Attention, HeadSummedProbabilities) {
  ProbSumCase c(params(67, 3, 3, 8, 5, 16), random_table(offsets_of({30, 37}), 13));
  check_op(c);
}

TEST(Attention, ShapeMismatchIsAnError) {
  Context ctx;
  ops::AttentionParams p = params(5, 2, 2, 4, 3, 5);
  Tensor q = Tensor::zeros({5, 2, 4}), k = Tensor::zeros({5, 2, 3}), v = Tensor::zeros({5, 2, 3});
  Tensor idx = Tensor::zeros({5, 5}, DType::I32), o = Tensor::zeros({5, 2, 3}),
         l = Tensor::zeros({5, 2});
  EXPECT_THROW(ops::attention_forward(ctx, p, q, k, v, idx, o, l), ShapeError);
  Tensor small = Tensor::zeros({5, 3}, DType::I32);
  EXPECT_THROW(ops::causal_indices(SeqInfo::from_lengths({5}), small), ShapeError);
}

}  // namespace
}  // namespace mt::test
