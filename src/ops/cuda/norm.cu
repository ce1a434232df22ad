// RMS, layer and L2 norms on the GPU: one block per row, fp32 statistics, x/y/dy/dx in the op's
// storage type (f32 or bf16), weights in the same type, weight gradients f32 (fp32 masters).
#include "ops/cuda/colsum.cuh"
#include "ops/cuda/common.cuh"
#include "ops/norm.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void rmsnorm_fwd_kernel(int64_t D, float eps, const T* x, const T* w, T* y,
                                   float* rstd) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float v = ld(xr, d);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float rs = rsqrtf(ss / static_cast<float>(D) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) st(y + r * D, d, ld(xr, d) * rs * ld(w, d));
}

template <typename T>
__global__ void rmsnorm_bwd_kernel(int64_t D, const T* x, const T* w, const float* rstd,
                                   const T* dy, T* dx) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  const T* dyr = dy + r * D;
  float s = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += ld(w, d) * ld(dyr, d) * ld(xr, d);
  s = block_sum(s);
  const float rs = rstd[r];
  const float c = rs * rs * rs * s / static_cast<float>(D);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    st(dx + r * D, d, rs * ld(w, d) * ld(dyr, d) - c * ld(xr, d));
}

template <typename T>
__global__ void layernorm_fwd_kernel(int64_t D, float eps, const T* x, const T* w, const T* b, T* y,
                                     float* mean, float* rstd) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  float s = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += ld(xr, d);
  const float mu = block_sum(s) / static_cast<float>(D);
  float v = 0.f;  // two passes: the variance of offset data stays accurate
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float c = ld(xr, d) - mu;
    v += c * c;
  }
  const float rs = rsqrtf(block_sum(v) / static_cast<float>(D) + eps);
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    st(y + r * D, d, (ld(xr, d) - mu) * rs * ld(w, d) + ld(b, d));
}

template <typename T>
__global__ void layernorm_bwd_kernel(int64_t D, const T* x, const T* w, const float* mean,
                                     const float* rstd, const T* dy, T* dx) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  const T* dyr = dy + r * D;
  const float mu = mean[r], rs = rstd[r];
  float sg = 0.f, sgx = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float g = ld(w, d) * ld(dyr, d);
    sg += g;
    sgx += g * (ld(xr, d) - mu) * rs;
  }
  const float mg = block_sum(sg) / static_cast<float>(D);
  const float mgx = block_sum(sgx) / static_cast<float>(D);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float xh = (ld(xr, d) - mu) * rs;
    st(dx + r * D, d, rs * (ld(w, d) * ld(dyr, d) - mg - xh * mgx));
  }
}

template <typename T>
__global__ void l2norm_fwd_kernel(int64_t D, float eps, const T* x, T* y, float* rstd) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float v = ld(xr, d);
    ss += v * v;
  }
  const float rs = rsqrtf(block_sum(ss) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) st(y + r * D, d, ld(xr, d) * rs);
}

template <typename T>
__global__ void l2norm_bwd_kernel(int64_t D, const T* x, const float* rstd, const T* dy, T* dx) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  const T* dyr = dy + r * D;
  float s = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += ld(dyr, d) * ld(xr, d);
  s = block_sum(s);
  const float rs = rstd[r];
  const float c = rs * rs * rs * s;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    st(dx + r * D, d, rs * ld(dyr, d) - c * ld(xr, d));
}

unsigned grid_rows(int64_t rows) {
  MT_CHECK(rows <= 0x7fffffff, ValueError, "norm: ", rows, " rows exceed one grid");
  return static_cast<unsigned>(rows);
}

}  // namespace

void rmsnorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w, Tensor& y,
                     Tensor& rstd) {
  expect_same_dtype("rmsnorm", x, w, "weight");
  expect_same_dtype("rmsnorm", x, y, "y");
  expect_f32("rmsnorm", rstd, "rstd");
  if (p.rows == 0) return;
  MT_DISPATCH_FLOAT(x, "rmsnorm", {
    rmsnorm_fwd_kernel<T><<<grid_rows(p.rows), kThreads, 0, stream(ctx)>>>(
        p.dim, p.eps, ptr<T>(x), ptr<T>(w), ptr<T>(y), ptr<float>(rstd));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void rmsnorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  expect_same_dtype("rmsnorm", x, w, "weight");
  expect_same_dtype("rmsnorm", x, dy, "dy");
  expect_same_dtype("rmsnorm", x, dx, "dx");
  expect_f32("rmsnorm", dw, "dw");
  if (p.rows == 0) return;
  MT_DISPATCH_FLOAT(x, "rmsnorm", {
    const T* px = ptr<T>(x);
    const T* pdy = ptr<T>(dy);
    const float* pr = ptr<float>(rstd);
    const int64_t D = p.dim;
    rmsnorm_bwd_kernel<T>
        <<<grid_rows(p.rows), kThreads, 0, stream(ctx)>>>(D, px, ptr<T>(w), pr, pdy, ptr<T>(dx));
    MT_CUDA_LAUNCH_CHECK();
    if (dw.defined())
      colsum_accumulate(ctx, p.rows, D, ptr<float>(dw), [=] __device__(int64_t r, int64_t c) {
        return ld(pdy, r * D + c) * ld(px, r * D + c) * pr[r];
      });
  });
}

void layernorm_forward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                       const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd) {
  expect_same_dtype("layernorm", x, w, "weight");
  expect_same_dtype("layernorm", x, b, "bias");
  expect_same_dtype("layernorm", x, y, "y");
  expect_f32("layernorm", mean, "mean");
  expect_f32("layernorm", rstd, "rstd");
  if (p.rows == 0) return;
  MT_DISPATCH_FLOAT(x, "layernorm", {
    layernorm_fwd_kernel<T><<<grid_rows(p.rows), kThreads, 0, stream(ctx)>>>(
        p.dim, p.eps, ptr<T>(x), ptr<T>(w), ptr<T>(b), ptr<T>(y), ptr<float>(mean),
        ptr<float>(rstd));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void layernorm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                        Tensor& dw, Tensor& db) {
  expect_same_dtype("layernorm", x, w, "weight");
  expect_same_dtype("layernorm", x, dy, "dy");
  expect_same_dtype("layernorm", x, dx, "dx");
  expect_f32("layernorm", dw, "dw");
  expect_f32("layernorm", db, "db");
  if (p.rows == 0) return;
  MT_DISPATCH_FLOAT(x, "layernorm", {
    const T* px = ptr<T>(x);
    const T* pdy = ptr<T>(dy);
    const float* pm = ptr<float>(mean);
    const float* pr = ptr<float>(rstd);
    const int64_t D = p.dim;
    layernorm_bwd_kernel<T><<<grid_rows(p.rows), kThreads, 0, stream(ctx)>>>(D, px, ptr<T>(w), pm,
                                                                             pr, pdy, ptr<T>(dx));
    MT_CUDA_LAUNCH_CHECK();
    if (dw.defined())
      colsum_accumulate(ctx, p.rows, D, ptr<float>(dw), [=] __device__(int64_t r, int64_t c) {
        return ld(pdy, r * D + c) * (ld(px, r * D + c) - pm[r]) * pr[r];
      });
    if (db.defined())
      colsum_accumulate(ctx, p.rows, D, ptr<float>(db),
                        [=] __device__(int64_t r, int64_t c) { return ld(pdy, r * D + c); });
  });
}

void l2norm_forward(Context& ctx, const NormParams& p, const Tensor& x, Tensor& y, Tensor& rstd) {
  expect_same_dtype("l2norm", x, y, "y");
  expect_f32("l2norm", rstd, "rstd");
  if (p.rows == 0) return;
  MT_DISPATCH_FLOAT(x, "l2norm", {
    l2norm_fwd_kernel<T><<<grid_rows(p.rows), kThreads, 0, stream(ctx)>>>(
        p.dim, p.eps, ptr<T>(x), ptr<T>(y), ptr<float>(rstd));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void l2norm_backward(Context& ctx, const NormParams& p, const Tensor& x, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx) {
  expect_same_dtype("l2norm", x, dy, "dy");
  expect_same_dtype("l2norm", x, dx, "dx");
  if (p.rows == 0) return;
  MT_DISPATCH_FLOAT(x, "l2norm", {
    l2norm_bwd_kernel<T><<<grid_rows(p.rows), kThreads, 0, stream(ctx)>>>(
        p.dim, ptr<T>(x), ptr<float>(rstd), ptr<T>(dy), ptr<T>(dx));
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
