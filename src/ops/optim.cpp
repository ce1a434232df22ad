#include "ops/optim.h"

#include "ops/dispatch.h"

namespace mt::ops {

void adamw_step(Context& ctx, const AdamWParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                Tensor& v) {
  MT_CHECK(p.step >= 1, ValueError, "adamw: step is 1-based, got ", p.step);
  expect_shape(grad, param.shape(), "adamw grad");
  expect_shape(m, param.shape(), "adamw first moment");
  expect_shape(v, param.shape(), "adamw second moment");
  dispatch(MT_OP_BODIES(adamw_step), {&param, &grad, &m, &v}, ctx, p, param, grad, m, v);
}

void grad_norm_sq(Context& ctx, const std::vector<Tensor>& grads, Tensor& out) {
  expect_f64_scalar(out, "grad_norm_sq output");
  if (op_device("grad_norm_sq", grads) == Device::CUDA) {
    MT_CHECK(out.device() == Device::CUDA, ValueError,
             "grad_norm_sq: gradients on cuda, output on ", device_name(out.device()));
#if MOETRAIN_WITH_CUDA
    return cuda::grad_norm_sq(ctx, grads, out);
#else
    no_cuda_backend("grad_norm_sq");
#endif
  }
  MT_CHECK(out.device() == Device::CPU, ValueError, "grad_norm_sq: gradients on cpu, output on ",
           device_name(out.device()));
  cpu::grad_norm_sq(ctx, grads, out);
}

void clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm, Tensor& norm) {
  expect_f64_scalar(norm, "clip_grad_norm norm");
  if (op_device("clip_grad_norm", grads) == Device::CUDA) {
    MT_CHECK(norm.device() == Device::CUDA, ValueError,
             "clip_grad_norm: gradients on cuda, norm on ", device_name(norm.device()));
#if MOETRAIN_WITH_CUDA
    return cuda::clip_grad_norm(ctx, grads, max_norm, norm);
#else
    no_cuda_backend("clip_grad_norm");
#endif
  }
  MT_CHECK(norm.device() == Device::CPU, ValueError, "clip_grad_norm: gradients on cpu, norm on ",
           device_name(norm.device()));
  cpu::clip_grad_norm(ctx, grads, max_norm, norm);
}

}  // namespace mt::ops
