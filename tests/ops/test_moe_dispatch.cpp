#include <gtest/gtest.h>

#include <algorithm>

#include "harness/op_check.h"
#include "ops/moe_dispatch.h"

namespace mt::test {
namespace {

// k distinct experts per token, drawn only from experts e with e % 3 != 1, so those experts are
// guaranteed to receive no tokens.
void draw_ids(Rng& rng, Tensor& t, int64_t experts) {
  std::vector<int32_t> pool;
  for (int32_t e = 0; e < experts; ++e)
    if (e % 3 != 1) pool.push_back(e);
  const int64_t T = t.dim(0), K = t.dim(1);
  for (int64_t i = 0; i < T; ++i) {
    std::vector<int32_t> p = pool;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t pick = j + rng.below(static_cast<int64_t>(p.size()) - j);
      std::swap(p[j], p[pick]);
      t.i32()[i * K + j] = p[j];
    }
  }
}

// Inputs: x [T,w], ids [T,k], expert outputs [T*k,w] in expert order, gate weights [T,k].
// Outputs: perm, offsets, gathered rows, combined y.
class DispatchCase : public OpCase {
 public:
  DispatchCase(int64_t T, int64_t E, int64_t K, int64_t W) : T_(T), E_(E), K_(K), W_(W) {}
  std::string name() const override {
    return cat("moe_dispatch T", T_, " E", E_, " k", K_, " w", W_);
  }
  std::vector<InputSpec> inputs() const override {
    const int64_t E = E_;
    return {{.name = "x", .shape = {T_, W_}},
            {.name = "ids",
             .shape = {T_, K_},
             .dtype = DType::I32,
             .differentiable = false,
             .init = [E](Rng& r, Tensor& t) { draw_ids(r, t, E); }},
            {.name = "expert_rows", .shape = {T_ * K_, W_}},
            {.name = "weights", .shape = {T_, K_}}};
  }
  std::vector<OutputSpec> outputs() const override {
    return {{"perm", false}, {"offsets", false}, {"rows"}, {"y"}};
  }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor perm = alloc({T_ * K_}, DType::I32), off = alloc({E_ + 1}, DType::I32);
    inv_ = alloc({T_ * K_}, DType::I32);
    ops::moe_dispatch_plan(ctx, in[1], E_, perm, inv_, off);
    Tensor rows = alloc({T_ * K_, W_}), y = alloc({T_, W_});
    ops::moe_gather(ctx, in[0], perm, K_, rows);
    ops::moe_combine(ctx, in[2], in[3], inv_, y);
    return {perm, off, rows, y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::moe_gather_backward(ctx, dout[2], inv_, K_, grads[0]);
    ops::moe_combine_backward(ctx, in[2], in[3], inv_, dout[3], grads[2], grads[3]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    const DVec &x = in[0], &ids = in[1], &er = in[2], &w = in[3];
    // Stable order by expert: for each expert in turn, its slots in slot order.
    DVec perm, off{0};
    std::vector<int64_t> row_of(static_cast<size_t>(T_ * K_));
    for (int64_t e = 0; e < E_; ++e) {
      for (int64_t s = 0; s < T_ * K_; ++s)
        if (static_cast<int64_t>(ids[s]) == e) {
          row_of[s] = static_cast<int64_t>(perm.size());
          perm.push_back(static_cast<double>(s));
        }
      off.push_back(static_cast<double>(perm.size()));
    }
    DVec rows(static_cast<size_t>(T_ * K_ * W_)), y(static_cast<size_t>(T_ * W_), 0.0);
    for (int64_t r = 0; r < T_ * K_; ++r) {
      const int64_t t = static_cast<int64_t>(perm[r]) / K_;
      for (int64_t c = 0; c < W_; ++c) rows[r * W_ + c] = x[t * W_ + c];
    }
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t j = 0; j < K_; ++j)
        for (int64_t c = 0; c < W_; ++c)
          y[t * W_ + c] += w[t * K_ + j] * er[row_of[t * K_ + j] * W_ + c];
    return {perm, off, rows, y};
  }

 private:
  int64_t T_, E_, K_, W_;
  Tensor inv_;
};

TEST(MoeDispatch, ZeroTokenExperts) {
  DispatchCase c(5, 8, 2, 13);
  check_op(c);
}

TEST(MoeDispatch, OddSizes) {
  DispatchCase c(37, 11, 3, 19);
  check_op(c);
}

TEST(MoeDispatch, TopOne) {
  DispatchCase c(17, 4, 1, 7);
  check_op(c);
}

TEST(MoeDispatch, PlanIsStableAndCountsEmptyExperts) {
  Context ctx;
  Tensor ids = Tensor::empty({4, 2}, DType::I32);
  const int32_t v[] = {3, 0, 0, 3, 3, 1, 0, 1};
  std::copy(v, v + 8, ids.i32());
  Tensor perm = Tensor::empty({8}, DType::I32), inv = Tensor::empty({8}, DType::I32);
  Tensor off = Tensor::empty({6}, DType::I32);
  ops::moe_dispatch_plan(ctx, ids, 5, perm, inv, off);
  const int32_t want_perm[] = {1, 2, 6, 5, 7, 0, 3, 4};
  const int32_t want_off[] = {0, 3, 5, 5, 8, 8};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(perm.i32()[i], want_perm[i]) << i;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(off.i32()[i], want_off[i]) << i;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(perm.i32()[inv.i32()[i]], i);
}

TEST(MoeDispatch, BadExpertIdIsAnError) {
  Context ctx;
  Tensor ids = Tensor::zeros({2, 1}, DType::I32);
  ids.i32()[1] = 4;
  Tensor perm = Tensor::empty({2}, DType::I32), inv = Tensor::empty({2}, DType::I32);
  Tensor off = Tensor::empty({5}, DType::I32);
  EXPECT_THROW(ops::moe_dispatch_plan(ctx, ids, 4, perm, inv, off), ValueError);
}

}  // namespace
}  // namespace mt::test
