// Rotary embeddings on the GPU. The frequencies come from the same host function the CPU path
// uses (YaRN included) and travel in the kernel's parameters; the angle is formed in double as on
// the CPU, because positions reach 1e5 and an fp32 angle would be off by ~1e-2 rad.
#include "ops/cuda/common.cuh"
#include "ops/rope.h"

namespace mt::ops::cuda {

namespace {

constexpr int kMaxHalf = 256;

struct RopeArgs {
  int64_t tokens, heads, head_dim, rot_offset, half;
  bool interleaved, in_place;
  double sign, magnitude;
  float freq[kMaxHalf];
};

// One block per token, threads over (head, pair); the untouched part of each head is copied.
template <typename T>
__global__ void rope_kernel(const __grid_constant__ RopeArgs a, const int32_t* pos, const T* x,
                            T* y) {
  const int64_t t = blockIdx.x;
  const int64_t H = a.heads, D = a.head_dim, off = a.rot_offset, half = a.half;
  const double p = static_cast<double>(pos[t]);
  if (!a.in_place) {
    for (int64_t e = threadIdx.x; e < H * D; e += blockDim.x) {
      const int64_t d = e % D;
      if (d < off || d >= off + 2 * half) st(y + t * H * D, e, ld(x + t * H * D, e));
    }
  }
  for (int64_t e = threadIdx.x; e < H * half; e += blockDim.x) {
    const int64_t h = e / half, i = e % half;
    double s, c;
    sincos(a.sign * p * static_cast<double>(a.freq[i]), &s, &c);
    const float cf = static_cast<float>(a.magnitude * c), sf = static_cast<float>(a.magnitude * s);
    const int64_t i1 = a.interleaved ? off + 2 * i : off + i;
    const int64_t i2 = a.interleaved ? i1 + 1 : i1 + half;
    const T* xh = x + (t * H + h) * D;
    T* yh = y + (t * H + h) * D;
    const float u = ld(xh, i1), v = ld(xh, i2);
    st(yh, i1, u * cf - v * sf);
    st(yh, i2, u * sf + v * cf);
  }
}

}  // namespace

void rope_rotate(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x,
                 Tensor& y, double sign) {
  expect_same_dtype("rope", x, y, "output");
  const int64_t half = p.rot_dim / 2;
  MT_CHECK(half <= kMaxHalf, ValueError, "rope: CUDA path rotates at most ", 2 * kMaxHalf,
           " dims, got ", p.rot_dim);
  if (p.tokens == 0) return;
  RopeArgs a{};
  a.tokens = p.tokens;
  a.heads = p.heads;
  a.head_dim = p.head_dim;
  a.rot_offset = p.rot_offset;
  a.half = half;
  a.interleaved = p.style == RopeStyle::Interleaved;
  a.in_place = x.raw() == y.raw();
  a.sign = sign;
  a.magnitude = p.scaling.magnitude;
  const std::vector<double> inv = rope_inv_freq(p);
  for (int64_t i = 0; i < half; ++i) a.freq[i] = static_cast<float>(inv[static_cast<size_t>(i)]);
  MT_DISPATCH_FLOAT(x, "rope", {
    rope_kernel<T><<<static_cast<unsigned>(p.tokens), 256, 0, stream(ctx)>>>(
        a, ptr<int32_t>(positions), ptr<T>(x), ptr<T>(y));
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
