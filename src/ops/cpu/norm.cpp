#include "ops/norm.h"

#include <omp.h>

#include <cmath>

#include "core/arena.h"

namespace mt::ops::cpu {

namespace {

// Per-thread partial column sums (one row of `partial` per thread) added into `dst` at the end:
// rows are split across threads, so the weight gradient needs a reduction.
void reduce_partials(const Tensor& partial, int64_t dim, float* dst) {
  const float* pp = partial.f32();
  for (int64_t t = 0; t < partial.dim(0); ++t)
    for (int64_t d = 0; d < dim; ++d) dst[d] += pp[t * dim + d];
}

// RMSNorm (mean = true: the mean square, times the weight pw) and L2 normalisation (mean = false:
// the sum of squares, no weight) are one row scaling: rstd = 1 / sqrt(squares + eps), y = x * rstd.
void scale_rows(Context& ctx, const NormParams& p, bool mean, const Tensor& x, const float* pw,
                Tensor& y, Tensor& rstd) {
  const float* px = x.f32();
  float* py = y.f32();
  float* pr = rstd.f32();
  const int64_t D = p.dim;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* xr = px + r * D;
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(xr[d]) * xr[d];
    const float rs = static_cast<float>(1.0 / std::sqrt((mean ? ss / D : ss) + p.eps));
    pr[r] = rs;
    float* yr = py + r * D;
    if (pw)
      for (int64_t d = 0; d < D; ++d) yr[d] = xr[d] * rs * pw[d];
    else
      for (int64_t d = 0; d < D; ++d) yr[d] = xr[d] * rs;
  }
}

}  // namespace

void rmsnorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w, Tensor& y,
                     Tensor& rstd) {
  scale_rows(ctx, p, true, x, w.f32(), y, rstd);
}

void rmsnorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  const bool want_dw = dw.defined();
  const float* px = x.f32();
  const float* pw = w.f32();
  const float* pr = rstd.f32();
  const float* pdy = dy.f32();
  float* pdx = dx.f32();
  const int64_t D = p.dim;
  const int nt = ctx.threads();
  ArenaScope scope(ctx.workspace());
  Tensor partial = want_dw ? ctx.workspace().zeros({nt, D}) : Tensor();
  float* part = want_dw ? partial.f32() : nullptr;
#pragma omp parallel num_threads(nt)
  {
    float* mine = part ? part + static_cast<int64_t>(omp_get_thread_num()) * D : nullptr;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* xr = px + r * D;
      const float* dyr = pdy + r * D;
      const float rs = pr[r];
      // dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * rstd.
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(dyr[d]) * pw[d] * xr[d] * rs;
      const float c = static_cast<float>(dot / D) * rs;
      float* dxr = pdx + r * D;
      for (int64_t d = 0; d < D; ++d) dxr[d] = rs * (dyr[d] * pw[d] - xr[d] * c);
      if (mine)
        for (int64_t d = 0; d < D; ++d) mine[d] += dyr[d] * xr[d] * rs;
    }
  }
  if (want_dw) reduce_partials(partial, D, dw.f32());
}

void layernorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                       const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd) {
  const float* px = x.f32();
  const float* pw = w.f32();
  const float* pb = b.f32();
  float* py = y.f32();
  float* pm = mean.f32();
  float* pr = rstd.f32();
  const int64_t D = p.dim;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* xr = px + r * D;
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += xr[d];
    const double mu = s / D;
    // Two passes: the variance of shifted values does not cancel catastrophically.
    double v = 0;
    for (int64_t d = 0; d < D; ++d) v += (xr[d] - mu) * (xr[d] - mu);
    const float rs = static_cast<float>(1.0 / std::sqrt(v / D + p.eps));
    const float m = static_cast<float>(mu);
    pm[r] = m;
    pr[r] = rs;
    float* yr = py + r * D;
    for (int64_t d = 0; d < D; ++d) yr[d] = (xr[d] - m) * rs * pw[d] + pb[d];
  }
}

void layernorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                        Tensor& dw, Tensor& db) {
  const bool want_dw = dw.defined(), want_db = db.defined();
  const float* px = x.f32();
  const float* pw = w.f32();
  const float* pm = mean.f32();
  const float* pr = rstd.f32();
  const float* pdy = dy.f32();
  float* pdx = dx.f32();
  const int64_t D = p.dim;
  const int nt = ctx.threads();
  ArenaScope scope(ctx.workspace());
  Tensor pw_part = want_dw ? ctx.workspace().zeros({nt, D}) : Tensor();
  Tensor pb_part = want_db ? ctx.workspace().zeros({nt, D}) : Tensor();
  float* wpart = want_dw ? pw_part.f32() : nullptr;
  float* bpart = want_db ? pb_part.f32() : nullptr;
#pragma omp parallel num_threads(nt)
  {
    const int64_t off = static_cast<int64_t>(omp_get_thread_num()) * D;
    float* wmine = wpart ? wpart + off : nullptr;
    float* bmine = bpart ? bpart + off : nullptr;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* xr = px + r * D;
      const float* dyr = pdy + r * D;
      const float m = pm[r], rs = pr[r];
      // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w.
      double sg = 0, sgx = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double g = static_cast<double>(dyr[d]) * pw[d];
        sg += g;
        sgx += g * (xr[d] - m) * rs;
      }
      const float mg = static_cast<float>(sg / D), mgx = static_cast<float>(sgx / D);
      float* dxr = pdx + r * D;
      for (int64_t d = 0; d < D; ++d) {
        const float xh = (xr[d] - m) * rs;
        dxr[d] = rs * (dyr[d] * pw[d] - mg - xh * mgx);
        if (wmine) wmine[d] += dyr[d] * xh;
        if (bmine) bmine[d] += dyr[d];
      }
    }
  }
  if (want_dw) reduce_partials(pw_part, D, dw.f32());
  if (want_db) reduce_partials(pb_part, D, db.f32());
}

void l2norm_forward(Context& ctx, const NormParams& p, const Tensor& x, Tensor& y, Tensor& rstd) {
  scale_rows(ctx, p, false, x, nullptr, y, rstd);
}

void l2norm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx) {
  const float* px = x.f32();
  const float* pr = rstd.f32();
  const float* pdy = dy.f32();
  float* pdx = dx.f32();
  const int64_t D = p.dim;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* xr = px + r * D;
    const float* dyr = pdy + r * D;
    const float rs = pr[r];
    // dx = rstd * (dy - y * <dy, y>) with y = x * rstd.
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(dyr[d]) * xr[d] * rs;
    const float c = static_cast<float>(dot) * rs;
    float* dxr = pdx + r * D;
    for (int64_t d = 0; d < D; ++d) dxr[d] = rs * (dyr[d] - xr[d] * c);
  }
}

}  // namespace mt::ops::cpu
