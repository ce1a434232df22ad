#include "ops/rope.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/arena.h"

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

// sign = +1 rotates by +pos * freq (forward), -1 by the opposite angle (its inverse/transpose).
void rotate(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x, Tensor& y,
            double sign) {
  check_args(p, positions, x, y);
  const int64_t half = p.rot_dim / 2, H = p.heads, D = p.head_dim, off = p.rot_offset;
  const bool in_place = x.raw() == y.raw();
  const int32_t* pos = positions.i32();
  const float* px = x.f32();
  float* py = y.f32();
  const int nt = ctx.threads();
  ArenaScope scope(ctx.workspace());
  // Per-thread cos/sin of the current token, shared by all its heads.
  Tensor table = ctx.workspace().alloc({nt, 2 * half});
  Tensor freq = ctx.workspace().alloc({half});
  float* tab = table.f32();
  float* fr = freq.f32();
  const std::vector<double> inv = rope_inv_freq(p);
  for (int64_t i = 0; i < half; ++i) fr[i] = static_cast<float>(inv[static_cast<size_t>(i)]);
  const double mag = p.scaling.magnitude;
  const bool interleaved = p.style == RopeStyle::Interleaved;
#pragma omp parallel num_threads(nt)
  {
    float* cs = tab + static_cast<int64_t>(omp_get_thread_num()) * 2 * half;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.tokens; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        // The angle in double: positions reach 1e5 and fp32 angles would be off by ~1e-2 rad.
        const double ang = sign * pos[t] * static_cast<double>(fr[i]);
        cs[i] = static_cast<float>(mag * std::cos(ang));
        cs[half + i] = static_cast<float>(mag * std::sin(ang));
      }
      for (int64_t h = 0; h < H; ++h) {
        const float* xh = px + (t * H + h) * D;
        float* yh = py + (t * H + h) * D;
        if (!in_place) {
          for (int64_t d = 0; d < off; ++d) yh[d] = xh[d];
          for (int64_t d = off + p.rot_dim; d < D; ++d) yh[d] = xh[d];
        }
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = interleaved ? off + 2 * i : off + i;
          const int64_t i2 = interleaved ? i1 + 1 : i1 + half;
          const float a = xh[i1], b = xh[i2], c = cs[i], s = cs[half + i];
          yh[i1] = a * c - b * s;
          yh[i2] = a * s + b * c;
        }
      }
    }
  }
}

}  // namespace

std::vector<double> rope_inv_freq(const RopeParams& p) {
  MT_CHECK(p.theta > 0, ValueError, "rope: theta must be positive, got ", p.theta);
  const RopeScaling& s = p.scaling;
  MT_CHECK(s.magnitude > 0 && s.factor > 0, ValueError, "rope: scaling factor ", s.factor,
           " and magnitude ", s.magnitude, " must be positive");
  const int64_t half = p.rot_dim / 2;
  const double dim = static_cast<double>(p.rot_dim), base = p.theta;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[static_cast<size_t>(i)] = std::pow(base, -2.0 * i / dim);
  if (s.factor <= 1.f || half == 0) return inv;
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
  return inv;
}

void rope_forward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x,
                  Tensor& y) {
  rotate(ctx, p, positions, x, y, 1.0);
}

void rope_backward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& dy,
                   Tensor& dx) {
  rotate(ctx, p, positions, dy, dx, -1.0);
}

}  // namespace mt::ops
