#include "ops/optim.h"

#include "ops/cpu/optim.h"
#include "ops/cuda/optim.h"
#include "ops/dispatch.h"

namespace mt::ops {

void adamw_step(Context& ctx, const AdamWParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                Tensor& v) {
  MT_CHECK(p.step >= 1, ValueError, "adamw: step is 1-based, got ", p.step);
  expect_shape(grad, param.shape(), "adamw grad");
  expect_shape(m, param.shape(), "adamw first moment");
  expect_shape(v, param.shape(), "adamw second moment");
  if (op_device("adamw_step", {&param, &grad, &m, &v}) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::adamw_step(ctx, p, param, grad, m, v);
#else
    no_cuda_backend("adamw_step");
#endif
  }
  cpu::adamw_step(ctx, p, param, grad, m, v);
}

double grad_norm_sq(Context& ctx, const std::vector<Tensor>& grads) {
  if (op_device("grad_norm_sq", grads) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::grad_norm_sq(ctx, grads);
#else
    no_cuda_backend("grad_norm_sq");
#endif
  }
  return cpu::grad_norm_sq(ctx, grads);
}

double clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm) {
  if (op_device("clip_grad_norm", grads) == Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::clip_grad_norm(ctx, grads, max_norm);
#else
    no_cuda_backend("clip_grad_norm");
#endif
  }
  return cpu::clip_grad_norm(ctx, grads, max_norm);
}

}  // namespace mt::ops
