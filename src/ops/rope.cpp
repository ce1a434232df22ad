#include "ops/rope.h"

#include <algorithm>
#include <cmath>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

constexpr double kPi = 3.14159265358979323846;

void check_args(const RopeParams& p, const Tensor& positions, const Tensor& x, const Tensor& y) {
  MT_CHECK(p.rot_dim >= 0 && p.rot_dim % 2 == 0 && p.rot_offset >= 0 &&
               p.rot_offset + p.rot_dim <= p.head_dim,
           ValueError, "rope: rot_offset ", p.rot_offset, " + rot_dim ", p.rot_dim,
           " must fit head_dim ", p.head_dim, " with rot_dim even");
  expect_shape(positions, {p.tokens}, "rope positions");
  expect_shape(x, {p.tokens, p.heads, p.head_dim}, "rope input");
  expect_shape(y, {p.tokens, p.heads, p.head_dim}, "rope output");
}

}  // namespace

std::vector<double> rope_inv_freq(const RopeParams& p) {
  std::vector<double> inv(static_cast<size_t>(std::max<int64_t>(p.rot_dim / 2, 0)));
  rope_inv_freq(p, inv);
  return inv;
}

void rope_inv_freq(const RopeParams& p, std::span<double> inv) {
  MT_CHECK(p.theta > 0, ValueError, "rope: theta must be positive, got ", p.theta);
  const RopeScaling& s = p.scaling;
  MT_CHECK(s.magnitude > 0 && s.factor > 0, ValueError, "rope: scaling factor ", s.factor,
           " and magnitude ", s.magnitude, " must be positive");
  const int64_t half = p.rot_dim / 2;
  const double dim = static_cast<double>(p.rot_dim), base = p.theta;
  MT_CHECK(static_cast<int64_t>(inv.size()) == half, ShapeError, "rope: ", inv.size(),
           " inverse frequencies requested, rot_dim ", p.rot_dim, " has ", half);
  for (int64_t i = 0; i < half; ++i) inv[static_cast<size_t>(i)] = std::pow(base, -2.0 * i / dim);
  if (s.factor <= 1.f || half == 0) return;
  MT_CHECK(s.original_max_positions > 0 && s.beta_fast > 0 && s.beta_slow > 0, ValueError,
           "rope: yarn needs positive original_max_position_embeddings, beta_fast, beta_slow");
  // Pair index whose wavelength fits `rotations` times into the pretraining context.
  auto pair_for = [&](double rotations) {
    return dim * std::log(static_cast<double>(s.original_max_positions) / (rotations * 2 * kPi)) /
           (2 * std::log(base));
  };
  double lo = pair_for(s.beta_fast), hi = pair_for(s.beta_slow);
  if (s.truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0);
  hi = std::min(hi, dim - 1);
  if (lo == hi) hi += 0.001;  // a step instead of a ramp; avoids dividing by zero
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    double& f = inv[static_cast<size_t>(i)];
    f = f / s.factor * ramp + f * (1 - ramp);
  }
}

void rope_forward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x,
                  Tensor& y) {
  check_args(p, positions, x, y);
  dispatch(MT_NAMED_OP_BODIES("rope_forward", rope_rotate), {&positions, &x, &y}, ctx, p, positions,
           x, y, 1.0);
}

void rope_backward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& dy,
                   Tensor& dx) {
  check_args(p, positions, dy, dx);
  dispatch(MT_NAMED_OP_BODIES("rope_backward", rope_rotate), {&positions, &dy, &dx}, ctx, p,
           positions, dy, dx, -1.0);
}

}  // namespace mt::ops
