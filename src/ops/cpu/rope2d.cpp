#include "ops/rope2d.h"

#include <cmath>

namespace mt::ops::cpu {

// sign = +1 rotates forward, -1 by the opposite angles (the inverse, i.e. the transpose).
void rope2d_rotate(Context& ctx, const Rope2dParams& p, const Tensor& positions, const Tensor& x,
                   Tensor& y, double sign) {
  const int64_t D = p.head_dim, half = D / 2, H = p.heads;
  const std::vector<double> inv = rope2d_inv_freq(p);
  const int32_t* pos = positions.i32();
  const float* px = x.f32();
  float* py = y.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < p.tokens; ++t) {
    const double row = pos[2 * t], col = pos[2 * t + 1];
    for (int64_t j = 0; j < half; ++j) {
      const double ang = sign * ((j % 2 == 0) ? col : row) * inv[static_cast<size_t>(j / 2)];
      const float c = static_cast<float>(std::cos(ang)), s = static_cast<float>(std::sin(ang));
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = (t * H + h) * D;
        const float a = px[base + j], b = px[base + j + half];
        py[base + j] = a * c - b * s;
        py[base + j + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace mt::ops::cpu
