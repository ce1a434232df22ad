// Grouped matmul on the GPU, direct version: the host holds the group offsets (the routing plan's
// host copy), so it loops over the non-empty groups and calls cuBLASLt once per group on that
// group's row range. A single grouped launch replaces the loop in the MoE kernel issue. Operands
// are f32 or bf16 (the row operands and W of one type), dW is f32 (a parameter gradient).
#include "ops/cuda/blas.h"
#include "ops/cuda/common.cuh"
#include "ops/grouped_matmul.h"

namespace mt::ops::cuda {

namespace {

// C_g *= beta for an empty group of the weight-gradient form (C_g = beta C_g + nothing).
__global__ void scale_kernel(int64_t n, float beta, float* c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    c[i] = beta == 0.f ? 0.f : beta * c[i];
}

MatRef rows_of(const Tensor& t, int64_t r0) {
  const auto* base = static_cast<const char*>(t.raw());
  return {base + r0 * t.stride(0) * static_cast<int64_t>(dtype_size(t.dtype())), t.dtype(),
          t.stride(0)};
}

// Group g's [out, in] block of W [G, out, in].
MatRef weight_of(const Tensor& w, int64_t g) {
  const int64_t out = w.dim(1), in = w.dim(2);
  return {static_cast<const char*>(w.raw()) +
              g * out * in * static_cast<int64_t>(dtype_size(w.dtype())),
          w.dtype(), in};
}

void* rows_ptr(const Tensor& t, int64_t r0) {
  return static_cast<char*>(t.raw()) +
         r0 * t.stride(0) * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c) {
  const bool dw = p.form == GroupedForm::DytX;
  const Tensor& w = dw ? c : b;
  const int64_t G = w.dim(0), out = w.dim(1), in = w.dim(2);
  expect_same_dtype("grouped_matmul", a, b, dw ? "X" : "W");
  if (dw)
    expect_f32("grouped_matmul", c, "dW");
  else
    expect_same_dtype("grouped_matmul", a, c, "C");
  const int32_t* off = offsets.i32();
  const int64_t wsize = out * in;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = off[g], m = off[g + 1] - off[g];
    if (m == 0) {
      if (dw && p.beta != 1.f && wsize > 0) {
        scale_kernel<<<blocks_for(wsize, 256, 1024), 256, 0, stream(ctx)>>>(
            wsize, p.beta, ptr<float>(c) + g * wsize);
        MT_CUDA_LAUNCH_CHECK();
      }
      continue;
    }
    switch (p.form) {
      case GroupedForm::XWt:  // C_g [m, out] = A_g [m, in] W_g^T
        lt_matmul(ctx, false, true, m, out, in, p.alpha, rows_of(a, r0), weight_of(b, g), p.beta,
                  rows_ptr(c, r0), c.dtype(), c.stride(0));
        break;
      case GroupedForm::DyW:  // C_g [m, in] = A_g [m, out] W_g
        lt_matmul(ctx, false, false, m, in, out, p.alpha, rows_of(a, r0), weight_of(b, g), p.beta,
                  rows_ptr(c, r0), c.dtype(), c.stride(0));
        break;
      case GroupedForm::DytX:  // dW_g [out, in] = A_g^T [out, m] X_g [m, in]
        lt_matmul(ctx, true, false, out, in, m, p.alpha, rows_of(a, r0), rows_of(b, r0), p.beta,
                  ptr<float>(c) + g * wsize, DType::F32, in);
        break;
    }
  }
}

}  // namespace mt::ops::cuda
