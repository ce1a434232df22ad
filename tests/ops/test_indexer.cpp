#include <gtest/gtest.h>

#include <cmath>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/attention.h"
#include "ops/indexer.h"
#include "ref/attention_ref.h"
#include "ref/indexer_ref.h"

namespace mt::test {
namespace {

// The op writes its loss into an f64 tensor (no host read inside the op); the tests read it.
double kl_forward(Context& ctx, const Tensor& scores, const Tensor& target, const Tensor& indices,
                  Tensor& softmax) {
  Tensor loss = Tensor::empty({1}, DType::F64, scores.device());
  ops::indexer_kl_forward(ctx, scores, target, indices, softmax, loss);
  return read_scalar(loss);
}

std::function<void(Rng&, Tensor&)> causal_table(std::vector<int64_t> lengths) {
  return [lengths](Rng&, Tensor& t) { ops::causal_indices(SeqInfo::from_lengths(lengths), t); };
}

// Random subsets of each row's causal positions (sorted, -1 padded), some rows empty.
std::function<void(Rng&, Tensor&)> sparse_table(std::vector<int64_t> lengths) {
  return [lengths](Rng& rng, Tensor& t) {
    const int64_t K = t.dim(1);
    int32_t* p = t.i32();
    int64_t b = 0;
    for (int64_t l : lengths) {
      for (int64_t r = b; r < b + l; ++r) {
        int64_t j = 0;
        for (int64_t s = b; s <= r && j < K; ++s)
          if (rng.uniform() < 0.6 && r % 17 != 5) p[r * K + j++] = static_cast<int32_t>(s);
        for (; j < K; ++j) p[r * K + j] = -1;
      }
      b += l;
    }
  };
}

std::function<void(Rng&, Tensor&)> positive(double lo, double hi) {
  return [lo, hi](Rng& rng, Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(rng.uniform(lo, hi));
  };
}

// A loss as a one-element output, and an upstream gradient read back, on either device.
Tensor scalar(GuardedAlloc& alloc, double v) {
  Tensor h = Tensor::empty({1});
  h.f32()[0] = static_cast<float>(v);
  Tensor l = alloc({1});
  l.copy_from(h);
  return l;
}

double host_scalar(const Tensor& t) {
  return t.to(Device::CPU).f32()[0];
}

class ScoresCase : public OpCase {
 public:
  ScoresCase(ops::IndexerParams p, std::function<void(Rng&, Tensor&)> table)
      : p_(p), table_(std::move(table)) {}
  std::string name() const override { return "indexer_scores"; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "q", .shape = {p_.tokens, p_.heads, p_.head_dim}},
            {.name = "k", .shape = {p_.tokens, p_.head_dim}},
            {.name = "w", .shape = {p_.tokens, p_.heads}},
            {.name = "indices",
             .shape = {p_.tokens, p_.kmax},
             .dtype = DType::I32,
             .differentiable = false,
             .init = table_}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"scores"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor s = alloc({p_.tokens, p_.kmax});
    ops::indexer_scores_forward(ctx, p_, in[0], in[1], in[2], in[3], s);
    return {s};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::indexer_scores_backward(ctx, p_, in[0], in[1], in[2], in[3], dout[0], grads[0], grads[1],
                                 grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::indexer_scores(in[0], in[1], in[2], in[3], p_.tokens, p_.heads, p_.head_dim,
                                p_.kmax, 1.0 / std::sqrt(static_cast<double>(p_.head_dim)))};
  }

 private:
  ops::IndexerParams p_;
  std::function<void(Rng&, Tensor&)> table_;
};

TEST(Indexer, ScoresDenseCausal) {
  ScoresCase c({.tokens = 67, .heads = 4, .head_dim = 12, .kmax = 37}, causal_table({30, 37}));
  check_op(c);
}

TEST(Indexer, ScoresSparseTable) {
  ScoresCase c({.tokens = 67, .heads = 3, .head_dim = 9, .kmax = 16}, sparse_table({40, 27}));
  check_op(c);
}

class TopkCase : public OpCase {
 public:
  TopkCase(std::vector<int64_t> lengths, int64_t topk, bool ties)
      : lengths_(std::move(lengths)), topk_(topk), ties_(ties) {
    for (int64_t l : lengths_) {
      T_ += l;
      kin_ = std::max(kin_, l);
    }
  }
  std::string name() const override { return "topk_select k=" + std::to_string(topk_); }
  std::vector<InputSpec> inputs() const override {
    InputSpec scores{.name = "scores", .shape = {T_, kin_}, .differentiable = false};
    // Few distinct values make ties common, exercising the lower-position rule.
    if (ties_)
      scores.init = [](Rng& rng, Tensor& t) {
        for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(rng.below(4));
      };
    return {scores,
            {.name = "candidates",
             .shape = {T_, kin_},
             .dtype = DType::I32,
             .differentiable = false,
             .init = causal_table(lengths_)}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"selected", false}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor out = alloc({T_, topk_}, DType::I32);
    ops::topk_select(ctx, in[0], in[1], topk_, out);
    return {out};
  }
  void backward(Context&, GuardedAlloc&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                std::vector<Tensor>&) override {}
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::topk_select(in[0], in[1], T_, kin_, topk_)};
  }

 private:
  std::vector<int64_t> lengths_;
  int64_t topk_;
  bool ties_;
  int64_t T_ = 0, kin_ = 0;
};

TEST(Indexer, TopkSmallerThanAvailable) {
  TopkCase c({30, 37}, 16, false);
  check_op(c);
}

TEST(Indexer, TopkWithTies) {
  TopkCase c({30, 37}, 16, true);
  check_op(c);
}

TEST(Indexer, TopkLargerThanAvailableIsCausalTable) {
  TopkCase c({30, 37}, 80, false);
  check_op(c);
  // Selecting everything gives the dense causal table, -1 padded.
  SeqInfo seq = SeqInfo::from_lengths({30, 37});
  Context ctx;
  Tensor cand = Tensor::empty({67, 37}, DType::I32), wide = Tensor::empty({67, 80}, DType::I32);
  ops::causal_indices(seq, cand);
  ops::causal_indices(seq, wide);
  Tensor scores = Tensor::empty({67, 37}), sel = Tensor::empty({67, 80}, DType::I32);
  Rng rng(test_seed());
  fill_normal(rng, scores);
  ops::topk_select(ctx, scores, cand, 80, sel);
  for (int64_t i = 0; i < sel.numel(); ++i) ASSERT_EQ(sel.i32()[i], wide.i32()[i]) << i;
}

class KlCase : public OpCase {
 public:
  KlCase(int64_t T, int64_t K, std::function<void(Rng&, Tensor&)> table)
      : T_(T), K_(K), table_(std::move(table)) {}
  std::string name() const override { return "indexer_kl"; }
  std::vector<InputSpec> inputs() const override {
    return {
        {.name = "scores", .shape = {T_, K_}, .scale = 2.0},
        {.name = "target", .shape = {T_, K_}, .differentiable = false, .init = positive(0.0, 3.0)},
        {.name = "indices",
         .shape = {T_, K_},
         .dtype = DType::I32,
         .differentiable = false,
         .init = table_}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"loss"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    sm_ = alloc({T_, K_});
    return {scalar(alloc, kl_forward(ctx, in[0], in[1], in[2], sm_))};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::indexer_kl_backward(ctx, sm_, in[1], in[2], host_scalar(dout[0]), grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {{ref::indexer_kl(in[0], in[1], in[2], T_, K_)}};
  }

 private:
  int64_t T_, K_;
  std::function<void(Rng&, Tensor&)> table_;
  Tensor sm_;
};

TEST(Indexer, KlLossDense) {
  KlCase c(67, 37, causal_table({30, 37}));
  check_op(c);
}

TEST(Indexer, KlLossSparseWithEmptyRows) {
  KlCase c(67, 16, sparse_table({40, 27}));
  check_op(c);
}

// The chain the DSA layer runs for its indexer: scores on the selected set, then the KL loss
// against a constant target.
class ScoresKlCase : public OpCase {
 public:
  ScoresKlCase(ops::IndexerParams p, std::function<void(Rng&, Tensor&)> table)
      : p_(p), table_(std::move(table)) {}
  std::string name() const override { return "indexer_scores_kl"; }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "q", .shape = {p_.tokens, p_.heads, p_.head_dim}},
            {.name = "k", .shape = {p_.tokens, p_.head_dim}},
            {.name = "w", .shape = {p_.tokens, p_.heads}},
            {.name = "target",
             .shape = {p_.tokens, p_.kmax},
             .differentiable = false,
             .init = positive(0.0, 1.0)},
            {.name = "indices",
             .shape = {p_.tokens, p_.kmax},
             .dtype = DType::I32,
             .differentiable = false,
             .init = table_}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"loss"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    scores_ = alloc({p_.tokens, p_.kmax});
    sm_ = alloc({p_.tokens, p_.kmax});
    ops::indexer_scores_forward(ctx, p_, in[0], in[1], in[2], in[4], scores_);
    return {scalar(alloc, kl_forward(ctx, scores_, in[3], in[4], sm_))};
  }
  void backward(Context& ctx, GuardedAlloc& alloc, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor ds = alloc({p_.tokens, p_.kmax});
    ops::indexer_kl_backward(ctx, sm_, in[3], in[4], host_scalar(dout[0]), ds);
    ops::indexer_scores_backward(ctx, p_, in[0], in[1], in[2], in[4], ds, grads[0], grads[1],
                                 grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    DVec s = ref::indexer_scores(in[0], in[1], in[2], in[4], p_.tokens, p_.heads, p_.head_dim,
                                 p_.kmax, 1.0 / std::sqrt(static_cast<double>(p_.head_dim)));
    return {{ref::indexer_kl(s, in[3], in[4], p_.tokens, p_.kmax)}};
  }

 private:
  ops::IndexerParams p_;
  std::function<void(Rng&, Tensor&)> table_;
  Tensor scores_, sm_;
};

TEST(Indexer, ScoresThroughKl) {
  ScoresKlCase c({.tokens = 67, .heads = 4, .head_dim = 8, .kmax = 16}, sparse_table({30, 37}));
  check_op(c);
}

TEST(Indexer, ShapeMismatchIsAnError) {
  Context ctx;
  ops::IndexerParams p{.tokens = 4, .heads = 2, .head_dim = 3, .kmax = 4};
  Tensor q = Tensor::zeros({4, 2, 3}), k = Tensor::zeros({4, 2}), w = Tensor::zeros({4, 2});
  Tensor idx = Tensor::zeros({4, 4}, DType::I32), s = Tensor::zeros({4, 4});
  EXPECT_THROW(ops::indexer_scores_forward(ctx, p, q, k, w, idx, s), ShapeError);
  Tensor sel = Tensor::zeros({4, 3}, DType::I32);
  EXPECT_THROW(ops::topk_select(ctx, s, idx, 2, sel), ShapeError);
}

}  // namespace
}  // namespace mt::test
