#include "ops/optim.h"

#include <cmath>

namespace mt::ops::cpu {

void adamw_step(Context& ctx, const AdamWParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                Tensor& v) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  // Bias corrections folded into two scalars: step = lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
  const float step_size = static_cast<float>(p.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - p.lr * p.weight_decay;
  const float b1 = p.beta1, b2 = p.beta2, eps = p.eps;
  float* pp = param.f32();
  const float* pg = grad.f32();
  float* pm = m.f32();
  float* pv = v.f32();
  const int64_t n = param.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = pg[i];
    const float mi = b1 * pm[i] + (1.0f - b1) * g;
    const float vi = b2 * pv[i] + (1.0f - b2) * g * g;
    pm[i] = mi;
    pv[i] = vi;
    // Decoupled decay acts on the pre-update parameter.
    pp[i] = pp[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

void grad_norm_sq(Context& ctx, const std::vector<Tensor>& grads, Tensor& out) {
  double total = 0;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;  // frozen parameters have no gradient
    const float* pg = g.f32();
    const int64_t n = g.numel();
    double s = 0;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static) reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(pg[i]) * pg[i];
    total += s;
  }
  out.f64()[0] = total;
}

void clip_grad_norm(Context& ctx, const std::vector<Tensor>& grads, double max_norm,
                    Tensor& norm_out) {
  grad_norm_sq(ctx, grads, norm_out);
  const double norm = std::sqrt(norm_out.f64()[0]);
  norm_out.f64()[0] = norm;
  if (max_norm <= 0 || !(norm > max_norm)) return;
  // The 1e-6 keeps the clipped norm just under max_norm, as torch's clip_grad_norm_ does.
  const float scale = static_cast<float>(max_norm / (norm + 1e-6));
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    float* pg = g.f32();
    const int64_t n = g.numel();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
    for (int64_t i = 0; i < n; ++i) pg[i] *= scale;
  }
}

}  // namespace mt::ops::cpu
