#include <gtest/gtest.h>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/grouped_matmul.h"
#include "ref/grouped_matmul_ref.h"

namespace mt::test {
namespace {

// Row counts per group with the first, the last and every third group empty.
void draw_offsets(Rng& rng, Tensor& t, int64_t rows) {
  const int64_t G = t.numel() - 1;
  std::vector<int32_t> cnt(static_cast<size_t>(G), 0);
  std::vector<int64_t> pool;
  for (int64_t g = 1; g + 1 < G; ++g)
    if (g % 3 != 1) pool.push_back(g);
  for (int64_t r = 0; r < rows; ++r) ++cnt[pool[rng.below(static_cast<int64_t>(pool.size()))]];
  int32_t* o = t.i32();
  o[0] = 0;
  for (int64_t g = 0; g < G; ++g) o[g + 1] = o[g] + cnt[g];
}

// Y = grouped XW^T; backward through the two other forms: dX = grouped dY W (written), dW +=
// grouped dY^T X. With `strided`, X, Y and dX live in column views of wider buffers.
class GroupedMatmulCase : public OpCase {
 public:
  GroupedMatmulCase(int64_t rows, int64_t groups, int64_t in, int64_t out, bool strided)
      : N_(rows), G_(groups), in_(in), out_(out), strided_(strided) {}
  std::string name() const override {
    return cat("grouped_matmul N", N_, " G", G_, " in", in_, " out", out_,
               strided_ ? " strided" : "");
  }
  std::vector<InputSpec> inputs() const override {
    const int64_t N = N_;
    return {{.name = "x", .shape = {N_, in_}},
            {.name = "offsets",
             .shape = {G_ + 1},
             .dtype = DType::I32,
             .differentiable = false,
             .init = [N](Rng& rng, Tensor& t) { draw_offsets(rng, t, N); },
             .host = true},
            {.name = "w", .shape = {G_, out_, in_}, .accumulate = true, .scale = 0.5}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  // A column view [rows, cols] at column 2 of a [rows, cols + 5] buffer, or a plain tensor.
  Tensor operand(GuardedAlloc& alloc, int64_t rows, int64_t cols) const {
    if (!strided_) return alloc({rows, cols});
    return alloc({rows, cols + 5}).cols(2, 2 + cols);
  }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor x = operand(alloc, N_, in_);
    ops::copy(ctx, in[0], x);
    Tensor y = operand(alloc, N_, out_);
    ops::grouped_matmul(ctx, {.form = ops::GroupedForm::XWt}, x, in[1], in[2], y);
    Tensor out = alloc({N_, out_});
    ops::copy(ctx, y, out);
    return {out};
  }
  void backward(Context& ctx, GuardedAlloc& alloc, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor dy = operand(alloc, N_, out_);
    ops::copy(ctx, dout[0], dy);
    Tensor x = operand(alloc, N_, in_);
    ops::copy(ctx, in[0], x);
    Tensor dx = operand(alloc, N_, in_);
    ops::grouped_matmul(ctx, {.form = ops::GroupedForm::DyW}, dy, in[1], in[2], dx);
    ops::copy(ctx, dx, grads[0]);
    ops::grouped_matmul(ctx, {.form = ops::GroupedForm::DytX, .beta = 1.f}, dy, in[1], x, grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::grouped_xwt(in[0], in[1], in[2], G_, out_, in_)};
  }

 private:
  int64_t N_, G_, in_, out_;
  bool strided_;
};

TEST(GroupedMatmul, EmptyGroupsOddSizes) {
  GroupedMatmulCase c(37, 8, 13, 11, false);
  check_op(c);
}

TEST(GroupedMatmul, StridedRowOperands) {
  GroupedMatmulCase c(29, 6, 9, 14, true);
  check_op(c);
}

TEST(GroupedMatmul, NoRows) {
  GroupedMatmulCase c(0, 4, 5, 3, false);
  check_op(c);
}

// alpha and beta in every form, against the reference: C = alpha * form + beta * C0; an empty
// group's dW block is only scaled.
TEST(GroupedMatmul, AlphaBetaAllForms) {
  Context ctx;
  Rng rng(test_seed());
  const int64_t N = 23, G = 5, in = 7, out = 6;
  Tensor off = Tensor::empty({G + 1}, DType::I32);
  draw_offsets(rng, off, N);
  Tensor x = Tensor::empty({N, in}), w = Tensor::empty({G, out, in}), dy = Tensor::empty({N, out});
  for (Tensor* t : {&x, &w, &dy}) fill_normal(rng, *t);
  const DVec dx_ = to_dvec(x), dw_ = to_dvec(w), ddy = to_dvec(dy), doff = to_dvec(off);
  const float alpha = 0.75f, beta = -0.5f;
  auto expect = [&](const Tensor& got, const DVec& c0, const DVec& prod) {
    DVec want(c0.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = alpha * prod[i] + beta * c0[i];
    EXPECT_LE(rel_err(to_dvec(got), want), 1e-5);
  };
  {
    Tensor y = Tensor::empty({N, out});
    fill_normal(rng, y);
    const DVec y0 = to_dvec(y);
    ops::grouped_matmul(ctx, {.form = ops::GroupedForm::XWt, .alpha = alpha, .beta = beta}, x, off,
                        w, y);
    expect(y, y0, ref::grouped_xwt(dx_, doff, dw_, G, out, in));
  }
  {
    Tensor gx = Tensor::empty({N, in});
    fill_normal(rng, gx);
    const DVec g0 = to_dvec(gx);
    ops::grouped_matmul(ctx, {.form = ops::GroupedForm::DyW, .alpha = alpha, .beta = beta}, dy, off,
                        w, gx);
    expect(gx, g0, ref::grouped_dyw(ddy, doff, dw_, G, out, in));
  }
  {
    Tensor gw = Tensor::empty({G, out, in});
    fill_normal(rng, gw);
    const DVec g0 = to_dvec(gw);
    ops::grouped_matmul(ctx, {.form = ops::GroupedForm::DytX, .alpha = alpha, .beta = beta}, dy,
                        off, x, gw);
    expect(gw, g0, ref::grouped_dytx(ddy, doff, dx_, G, out, in));
  }
}

TEST(GroupedMatmul, BadOperandsAreErrors) {
  Context ctx;
  Tensor off = Tensor::zeros({3}, DType::I32);
  off.i32()[1] = 2;
  off.i32()[2] = 4;
  Tensor x = Tensor::zeros({4, 3}), w = Tensor::zeros({2, 5, 3}), y = Tensor::zeros({4, 5});
  ops::grouped_matmul(ctx, {}, x, off, w, y);
  off.i32()[2] = 3;  // does not reach the rows
  EXPECT_THROW(ops::grouped_matmul(ctx, {}, x, off, w, y), ValueError);
  off.i32()[2] = 4;
  Tensor y_bad = Tensor::zeros({4, 4});
  EXPECT_THROW(ops::grouped_matmul(ctx, {}, x, off, w, y_bad), ShapeError);
  Tensor wide = Tensor::zeros({4, 3, 2});  // [rows, in] with a column stride of 2 is not a matrix
  Tensor w3 = Tensor::zeros({2, 5, 2});
  Tensor x_cols = wide.view({4, 6}).cols(0, 2);
  ops::grouped_matmul(ctx, {}, x_cols, off, w3, y);  // row-strided: fine
  Tensor w_strided = Tensor::zeros({2, 5, 6}).cols(0, 3);
  EXPECT_THROW(ops::grouped_matmul(ctx, {}, x, off, w_strided, y), ShapeError);
}

}  // namespace
}  // namespace mt::test
