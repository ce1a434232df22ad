#include <gtest/gtest.h>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/gemm.h"

namespace mt::test {
namespace {

// C = alpha op(A) op(B) + beta C in double, on row-major [rows, cols] operands.
DVec ref_matmul(const DVec& a, bool ta, const DVec& b, bool tb, const DVec& c0, int64_t m,
                int64_t n, int64_t k, double alpha, double beta) {
  DVec c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += (ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
      c[static_cast<size_t>(i * n + j)] = alpha * s + beta * c0[static_cast<size_t>(i * n + j)];
    }
  return c;
}

// Every transpose combination, each operand a column view of a wider matrix.
TEST(Gemm, MatmulOnRowStridedViews) {
  Context ctx;
  Rng rng(test_seed());
  const int64_t m = 13, n = 9, k = 11;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor wa = Tensor::empty({ta ? k : m, (ta ? m : k) + 4});
      Tensor wb = Tensor::empty({tb ? n : k, (tb ? k : n) + 3});
      Tensor wc = Tensor::empty({m, n + 5});
      for (Tensor* t : {&wa, &wb, &wc}) fill_normal(rng, *t);
      const Tensor a = wa.cols(1, 1 + (ta ? m : k)), b = wb.cols(3, 3 + (tb ? k : n));
      Tensor c = wc.cols(5, 5 + n);
      Tensor da = Tensor::empty(a.shape()), db = Tensor::empty(b.shape()),
             dc = Tensor::empty(c.shape());
      da.copy_from(a);
      db.copy_from(b);
      dc.copy_from(c);
      Tensor left = Tensor::empty({m, 5});
      left.copy_from(wc.cols(0, 5));
      ops::matmul(ctx, a, ta, b, tb, c, 0.5f, -1.25f);
      Tensor got = Tensor::empty({m, n});
      got.copy_from(c);
      const DVec want =
          ref_matmul(to_dvec(da), ta, to_dvec(db), tb, to_dvec(dc), m, n, k, 0.5, -1.25);
      EXPECT_LE(rel_err(to_dvec(got), want), 1e-5) << "ta=" << ta << " tb=" << tb;
      Tensor left_after = Tensor::empty({m, 5});
      left_after.copy_from(wc.cols(0, 5));
      EXPECT_EQ(rel_err(to_dvec(left_after), to_dvec(left)), 0.0) << "columns outside C changed";
    }
}

TEST(Gemm, BadOperandsAreShapeErrors) {
  Context ctx;
  Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({4, 5}), c = Tensor::zeros({3, 5});
  ops::matmul(ctx, a, false, b, false, c);
  Tensor c_bad = Tensor::zeros({3, 4});
  EXPECT_THROW(ops::matmul(ctx, a, false, b, false, c_bad), ShapeError);
  Tensor a3 = Tensor::zeros({3, 4, 1});
  EXPECT_THROW(ops::matmul(ctx, a3, false, b, false, c), ShapeError);
  Tensor ai = Tensor::zeros({3, 4}, DType::I32);
  EXPECT_THROW(ops::matmul(ctx, ai, false, b, false, c), ShapeError);
}

}  // namespace
}  // namespace mt::test
