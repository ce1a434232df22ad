#include "ops/rope.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/arena.h"

namespace mt::ops::cpu {

// sign = +1 rotates by +pos * freq (forward), -1 by the opposite angle (its inverse/transpose).
void rope_rotate(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x,
                 Tensor& y, double sign) {
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
  Tensor inv = ctx.workspace().alloc({half}, DType::I64);  // doubles, 8 bytes each
  auto* pinv = static_cast<double*>(inv.raw());
  rope_inv_freq(p, std::span<double>(pinv, static_cast<size_t>(half)));
  for (int64_t i = 0; i < half; ++i) fr[i] = static_cast<float>(pinv[i]);
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

}  // namespace mt::ops::cpu
