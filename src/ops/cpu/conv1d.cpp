#include "ops/conv1d.h"

#include <omp.h>

#include <algorithm>

#include "core/arena.h"
#include "ops/activation.h"

namespace mt::ops::cpu {

namespace {

// First token of the document holding token t.
int64_t doc_start(const int32_t* cu, int64_t n, int64_t t) {
  const int32_t* it = std::upper_bound(cu, cu + n + 1, static_cast<int32_t>(t));
  return *(it - 1);
}

}  // namespace

void causal_conv1d_forward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                           const Tensor& x, const Tensor& w, Tensor& y) {
  if (p.silu) {  // the conv, then its SiLU in place
    CausalConvParams conv = p;
    conv.silu = false;
    cpu::causal_conv1d_forward(ctx, conv, cu_seqlens, x, w, y);
    return cpu::silu_forward(ctx, y, y);  // element-wise: in place
  }
  const int32_t* cu = cu_seqlens.i32();
  const int64_t n = cu_seqlens.dim(0) - 1, C = p.channels, K = p.kernel;
  const float* px = x.f32();
  const float* pw = w.f32();
  float* py = y.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < p.tokens; ++t) {
    // Taps before the document start read zeros, so they are simply skipped.
    const int64_t j0 = std::max<int64_t>(0, doc_start(cu, n, t) - (t - (K - 1)));
    float* yr = py + t * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = 0.f;
    for (int64_t j = j0; j < K; ++j) {
      const float* xr = px + (t - (K - 1) + j) * C;
      for (int64_t c = 0; c < C; ++c) yr[c] += pw[c * K + j] * xr[c];
    }
  }
}

void causal_conv1d_backward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                            const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                            Tensor& dw) {
  if (p.silu) {  // the conv's output formed again, dy through SiLU's derivative, then the conv's
    CausalConvParams conv = p;
    conv.silu = false;
    ArenaScope scope(ctx.workspace());
    Tensor dpre = ctx.workspace().alloc({p.tokens, p.channels});
    cpu::causal_conv1d_forward(ctx, conv, cu_seqlens, x, w, dpre);
    cpu::silu_backward(ctx, dpre, dy, dpre);  // element-wise: in place
    return cpu::causal_conv1d_backward(ctx, conv, cu_seqlens, x, w, dpre, dx, dw);
  }
  const bool want_dw = dw.defined();
  const int32_t* cu = cu_seqlens.i32();
  const int64_t n = cu_seqlens.dim(0) - 1, C = p.channels, K = p.kernel;
  const float* px = x.f32();
  const float* pw = w.f32();
  const float* pdy = dy.f32();
  float* pdx = dx.f32();
  const int nt = ctx.threads();
  ArenaScope scope(ctx.workspace());
  // Tokens are split across threads, so dw is reduced from per-thread partials.
  Tensor partial = want_dw ? ctx.workspace().zeros({nt, C * K}) : Tensor();
  float* part = want_dw ? partial.f32() : nullptr;
#pragma omp parallel num_threads(nt)
  {
    float* mine = part ? part + static_cast<int64_t>(omp_get_thread_num()) * C * K : nullptr;
#pragma omp for schedule(static)
    for (int64_t s = 0; s < p.tokens; ++s) {
      // x[s] feeds y[s + K-1 - j] for the outputs still inside its document.
      const int64_t end = *std::upper_bound(cu, cu + n + 1, static_cast<int32_t>(s));
      const int64_t j0 = std::max<int64_t>(0, s + (K - 1) - (end - 1));
      float* dxr = pdx + s * C;
      for (int64_t c = 0; c < C; ++c) dxr[c] = 0.f;
      for (int64_t j = j0; j < K; ++j) {
        const float* dyr = pdy + (s + (K - 1) - j) * C;
        for (int64_t c = 0; c < C; ++c) dxr[c] += pw[c * K + j] * dyr[c];
      }
      if (mine) {
        // Gathered per output token t = s: the taps that stay inside t's document.
        const int64_t k0 = std::max<int64_t>(0, doc_start(cu, n, s) - (s - (K - 1)));
        const float* dyr = pdy + s * C;
        for (int64_t j = k0; j < K; ++j) {
          const float* xr = px + (s - (K - 1) + j) * C;
          for (int64_t c = 0; c < C; ++c) mine[c * K + j] += dyr[c] * xr[c];
        }
      }
    }
  }
  if (want_dw) {
    float* pdw = dw.f32();
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t i = 0; i < C * K; ++i) pdw[i] += part[t * C * K + i];
  }
}

}  // namespace mt::ops::cpu
