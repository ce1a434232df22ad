#include "ops/rope2d.h"

#include <cmath>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check(const Rope2dParams& p, const Tensor& positions, const Tensor& x, const Tensor& y,
           const char* xname, const char* yname) {
  rope2d_inv_freq(p);
  expect_shape(positions, {p.tokens, 2}, "rope2d positions");
  MT_CHECK(positions.dtype() == DType::I32, ShapeError, "rope2d positions must be i32, got ",
           dtype_name(positions.dtype()));
  expect_shape(x, {p.tokens, p.heads, p.head_dim}, xname);
  expect_shape(y, {p.tokens, p.heads, p.head_dim}, yname);
}

}  // namespace

std::vector<double> rope2d_inv_freq(const Rope2dParams& p) {
  MT_CHECK(p.tokens >= 0 && p.heads > 0 && p.head_dim > 0 && p.head_dim % 4 == 0, ValueError,
           "rope2d: bad params tokens ", p.tokens, " heads ", p.heads, " head_dim ", p.head_dim,
           " (head_dim must be a positive multiple of 4)");
  MT_CHECK(p.theta > 1.f, ValueError, "rope2d: theta must be > 1, got ", p.theta);
  const int64_t q = p.head_dim / 4;
  std::vector<double> inv(static_cast<size_t>(q));
  for (int64_t i = 0; i < q; ++i)
    inv[static_cast<size_t>(i)] =
        std::pow(static_cast<double>(p.theta), -4.0 * static_cast<double>(i) / p.head_dim);
  return inv;
}

void rope2d_forward(Context& ctx, const Rope2dParams& p, const Tensor& positions, const Tensor& x,
                    Tensor& y) {
  check(p, positions, x, y, "rope2d x", "rope2d y");
  dispatch(MT_NAMED_OP_BODIES("rope2d_forward", rope2d_rotate), {&positions, &x, &y}, ctx, p,
           positions, x, y, 1.0);
}

void rope2d_backward(Context& ctx, const Rope2dParams& p, const Tensor& positions, const Tensor& dy,
                     Tensor& dx) {
  check(p, positions, dy, dx, "rope2d dy", "rope2d dx");
  dispatch(MT_NAMED_OP_BODIES("rope2d_backward", rope2d_rotate), {&positions, &dy, &dx}, ctx, p,
           positions, dy, dx, -1.0);
}

}  // namespace mt::ops
