// The absorbed MQA form of sparse attention (ops/sparse_mqa_attention.h) against its double
// reference, with finite-difference gradients: the key gradient of a shared latent row sums the
// key path (all columns) and the value path (its first Dv columns) over every listed slot. The
// head-summed probabilities (the DSA KL target) ride along as a third output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/sparse_mqa_attention.h"
#include "ref/sparse_mqa_ref.h"

namespace mt::test {
namespace {

// Row t of each document: up to kmax positions of the document up to t. `sorted`: as the top-k
// writes them (increasing, -1 padded, always t itself); otherwise scattered with -1 slots and
// duplicates, every 9th row empty.
std::function<void(Rng&, Tensor&)> lists(std::vector<int64_t> lengths, bool sorted) {
  return [lengths, sorted](Rng& rng, Tensor& t) {
    const int64_t K = t.dim(1);
    int32_t* p = t.i32();
    int64_t b = 0;
    for (int64_t len : lengths) {
      for (int64_t r = b; r < b + len; ++r) {
        std::vector<int32_t> row;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t s = b + rng.below(r - b + 1);
          row.push_back(sorted
                            ? (rng.uniform() < 0.5 ? static_cast<int32_t>(s) : -1)
                            : (rng.uniform() < 0.2 || r % 9 == 4 ? -1 : static_cast<int32_t>(s)));
        }
        if (sorted) {
          row[0] = static_cast<int32_t>(r);
          std::sort(row.begin(), row.end());
          row.erase(std::unique(row.begin(), row.end()), row.end());
          row.erase(std::remove(row.begin(), row.end(), -1), row.end());
          row.resize(static_cast<size_t>(K), -1);
        }
        std::copy(row.begin(), row.end(), p + r * K);
      }
      b += len;
    }
  };
}

class SparseMqaCase : public OpCase {
 public:
  SparseMqaCase(std::string name, ops::SparseMqaParams p, std::function<void(Rng&, Tensor&)> table)
      : name_(std::move(name)), p_(p), table_(std::move(table)) {}
  std::string name() const override { return name_; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "q", .shape = {p_.tokens, p_.heads, p_.qk_dim}, .scale = 1.5},
            {.name = "kv", .shape = {p_.tokens, p_.qk_dim}},
            {.name = "indices",
             .shape = {p_.tokens, p_.kmax},
             .dtype = DType::I32,
             .differentiable = false,
             .init = table_}};
  }
  // lse is compared as Z = exp(lse), the row's partition sum: finite everywhere, and 0 exactly
  // for a row without valid slots (lse = -inf, o = 0).
  // prob_sum: the head-summed probabilities per slot (the DSA KL target), from the lse.
  std::vector<OutputSpec> outputs() const override {
    return {{"o"}, {"Z", false}, {"prob_sum", false}};
  }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    o_ = alloc({p_.tokens, p_.heads, p_.v_dim});
    lse_ = alloc({p_.tokens, p_.heads});
    ops::sparse_mqa_forward(ctx, p_, in[0], in[1], in[2], o_, lse_);
    ctx.synchronize();
    Tensor z_h = lse_.to(Device::CPU);
    std::transform(z_h.f32(), z_h.f32() + z_h.numel(), z_h.f32(),
                   [](float l) { return std::exp(l); });
    Tensor z = alloc(lse_.shape());
    z.copy_from(z_h);
    Tensor prob = alloc({p_.tokens, p_.kmax});
    ops::sparse_mqa_prob_sum(ctx, p_, in[0], in[1], in[2], lse_, prob);
    return {o_, z, prob};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor none;
    ops::sparse_mqa_backward(ctx, p_, in[0], in[1], in[2], o_, lse_, dout[0], grads[0], grads[1],
                             none);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::AttnRefOut r = ref::sparse_mqa(in[0], in[1], in[2], p_.tokens, p_.heads, p_.qk_dim,
                                        p_.v_dim, p_.kmax, p_.scale);
    for (double& l : r.lse) l = std::exp(l);
    DVec prob(static_cast<size_t>(p_.tokens * p_.kmax), 0.0);
    for (int64_t t = 0; t < p_.tokens; ++t)
      for (int64_t h = 0; h < p_.heads; ++h)
        for (int64_t j = 0; j < p_.kmax; ++j)
          prob[t * p_.kmax + j] += r.p[(t * p_.heads + h) * p_.kmax + j];
    return {r.o, r.lse, prob};
  }

 private:
  std::string name_;
  ops::SparseMqaParams p_;
  std::function<void(Rng&, Tensor&)> table_;
  Tensor o_, lse_;
};

ops::SparseMqaParams params(int64_t T, int64_t H, int64_t Dk, int64_t Dv, int64_t K) {
  return {.tokens = T,
          .heads = H,
          .qk_dim = Dk,
          .v_dim = Dv,
          .kmax = K,
          .scale = 1.f / std::sqrt(static_cast<float>(Dk))};
}

TEST(SparseMqaAttention, ScatteredListsWithEmptyRowsTwoDocuments) {
  SparseMqaCase c("scattered", params(53, 5, 40, 32, 13), lists({30, 23}, false));
  check_op(c);
}

// DeepSeek-V3.2's widths (576 = 512 latent + 64 rope, values the latent), lists as the top-k
// writes them, T not a multiple of the GPU's tiles.
TEST(SparseMqaAttention, DeepSeekWidthsSelectionLists) {
  SparseMqaCase c("576/512", params(37, 16, 576, 512, 24), lists({20, 17}, true));
  check_op(c,
           {.fwd_rtol = 2e-5, .grad_rtol = 2e-4, .fd_step = 1e-6, .directions = 1, .elements = 4});
}

// The backward's optional KL target (the DSA layer's, in a training step) against the double
// reference's head-summed P, with dq and dkv unchanged by asking for it.
TEST(SparseMqaAttention, BackwardWritesTheKlTarget) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE(cat("seed=", seed, " (rerun: ", seed_note(), ")"));
  Rng rng(seed);
  const ops::SparseMqaParams p = params(41, 6, 48, 40, 17);
  Tensor q = Tensor::empty({p.tokens, p.heads, p.qk_dim}), kv = Tensor::empty({p.tokens, p.qk_dim});
  Tensor idx = Tensor::empty({p.tokens, p.kmax}, DType::I32),
         dout = Tensor::empty({p.tokens, p.heads, p.v_dim});
  fill_normal(rng, q, 1.5);
  fill_normal(rng, kv);
  fill_normal(rng, dout);
  lists({25, 16}, false)(rng, idx);  // empty rows, -1 slots and duplicates
  Context ctx;
  Tensor o = Tensor::empty({p.tokens, p.heads, p.v_dim}), lse = Tensor::empty({p.tokens, p.heads});
  ops::sparse_mqa_forward(ctx, p, q, kv, idx, o, lse);
  Tensor dq = Tensor::empty(q.shape()), dkv = Tensor::empty(kv.shape());
  Tensor dq1 = Tensor::empty(q.shape()), dkv1 = Tensor::empty(kv.shape());
  Tensor prob = Tensor::empty({p.tokens, p.kmax}), none;
  std::fill(prob.f32(), prob.f32() + prob.numel(), 7.f);  // every slot must be written
  ops::sparse_mqa_backward(ctx, p, q, kv, idx, o, lse, dout, dq, dkv, prob);
  ops::sparse_mqa_backward(ctx, p, q, kv, idx, o, lse, dout, dq1, dkv1, none);
  EXPECT_EQ(std::memcmp(dq.raw(), dq1.raw(), dq.bytes()), 0);
  EXPECT_EQ(std::memcmp(dkv.raw(), dkv1.raw(), dkv.bytes()), 0);
  const ref::AttnRefOut r = ref::sparse_mqa(to_dvec(q), to_dvec(kv), to_dvec(idx), p.tokens,
                                            p.heads, p.qk_dim, p.v_dim, p.kmax, p.scale);
  int64_t nonzero = 0;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t j = 0; j < p.kmax; ++j) {
      double want = 0;
      for (int64_t h = 0; h < p.heads; ++h) want += r.p[(t * p.heads + h) * p.kmax + j];
      const float got = prob.f32()[t * p.kmax + j];
      EXPECT_NEAR(got, want, 1e-5 * std::abs(want) + 1e-6) << "t " << t << " slot " << j;
      nonzero += want > 0;
    }
  EXPECT_GT(nonzero, p.tokens);
  Tensor bad = Tensor::zeros({p.tokens, p.kmax + 1});
  EXPECT_THROW(ops::sparse_mqa_backward(ctx, p, q, kv, idx, o, lse, dout, dq, dkv, bad),
               ShapeError);
}

TEST(SparseMqaAttention, ShapeMismatchIsAnError) {
  Context ctx;
  Tensor q = Tensor::zeros({5, 2, 8}), kv = Tensor::zeros({5, 8}), o = Tensor::zeros({5, 2, 6}),
         lse = Tensor::zeros({5, 2}), idx = Tensor::zeros({5, 3}, DType::I32);
  EXPECT_THROW(ops::sparse_mqa_forward(ctx, params(5, 2, 8, 9, 3), q, kv, idx, o, lse), ValueError);
  Tensor kv3 = Tensor::zeros({5, 1, 8});
  EXPECT_THROW(ops::sparse_mqa_forward(ctx, params(5, 2, 8, 6, 3), q, kv3, idx, o, lse),
               ShapeError);
  Tensor idx64 = Tensor::zeros({5, 3}, DType::I64);
  EXPECT_THROW(ops::sparse_mqa_forward(ctx, params(5, 2, 8, 6, 3), q, kv, idx64, o, lse),
               ShapeError);
}

}  // namespace
}  // namespace mt::test
