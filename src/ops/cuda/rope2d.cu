// The axial 2-D RoPE on the GPU: one thread per (token, head, pair j < head_dim / 2). The angle
// and its cosine and sine are computed in double, as the CPU body does, so both round the same
// rotation to fp32.
#include "ops/cuda/common.cuh"
#include "ops/rope2d.h"

namespace mt::ops::cuda {

// sign = +1 rotates forward, -1 by the opposite angles (the backward). y may alias x: each
// thread reads its pair before writing it.
void rope2d_rotate(Context& ctx, const Rope2dParams& p, const Tensor& positions, const Tensor& x,
                   Tensor& y, double sign) {
  expect_same_dtype("rope2d", x, y, "output");
  const int64_t D = p.head_dim, half = D / 2, H = p.heads;
  const double theta = p.theta;
  const int32_t* pos = ptr<int32_t>(positions);
  MT_DISPATCH_FLOAT(x, "rope2d", {
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    for_each_index(ctx, p.tokens * H * half, [=] __device__(int64_t i) {
      const int64_t j = i % half, th = i / half, t = th / H;
      const double inv = pow(theta, -4.0 * static_cast<double>(j / 2) / static_cast<double>(D));
      const double ang = sign * static_cast<double>(pos[2 * t + (j % 2 == 0 ? 1 : 0)]) * inv;
      const float c = static_cast<float>(cos(ang)), s = static_cast<float>(sin(ang));
      const int64_t base = th * D;
      const float a = ld(px, base + j), b = ld(px, base + j + half);
      st(py, base + j, a * c - b * s);
      st(py, base + j + half, b * c + a * s);
    });
  });
}

}  // namespace mt::ops::cuda
