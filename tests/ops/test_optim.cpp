#include <gtest/gtest.h>

#include <cmath>

#include "harness/op_check.h"
#include "ops/optim.h"
#include "ref/optim_ref.h"

namespace mt::test {
namespace {

// The ops write their norms into f64 tensors (no host read inside an op); the tests read them.
double norm_sq(Context& ctx, const std::vector<Tensor>& grads) {
  Tensor out = Tensor::empty({1}, DType::F64);
  ops::grad_norm_sq(ctx, grads, out);
  return out.f64()[0];
}
double clip(Context& ctx, const std::vector<Tensor>& grads, double max_norm) {
  Tensor out = Tensor::empty({1}, DType::F64);
  ops::clip_grad_norm(ctx, grads, max_norm, out);
  return out.f64()[0];
}

// Three steps with fresh gradients each time, against a double scalar AdamW per element.
TEST(Optim, AdamWMatchesScalarReference) {
  Context ctx;
  Rng rng(ctx.rng().next_u64());
  const int64_t n = 1001;
  ops::AdamWParams p{
      .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  Tensor param = Tensor::empty({n}), grad = Tensor::empty({n});
  Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
  fill_normal(rng, param);
  std::vector<ref::AdamWState> want(n);
  for (int64_t i = 0; i < n; ++i) want[i].param = param.f32()[i];
  for (int64_t step = 1; step <= 3; ++step) {
    fill_normal(rng, grad, 0.1 * step);
    p.step = step;
    ops::adamw_step(ctx, p, param, grad, m, v);
    for (int64_t i = 0; i < n; ++i)
      ref::adamw(want[i], grad.f32()[i], p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, step);
  }
  double worst_p = 0, worst_m = 0, worst_v = 0;
  for (int64_t i = 0; i < n; ++i) {
    worst_p = std::max(worst_p,
                       std::abs(param.f32()[i] - want[i].param) / (std::abs(want[i].param) + p.lr));
    worst_m = std::max(worst_m, std::abs(m.f32()[i] - want[i].m) / (std::abs(want[i].m) + 1e-6));
    worst_v = std::max(worst_v, std::abs(v.f32()[i] - want[i].v) / (std::abs(want[i].v) + 1e-9));
  }
  EXPECT_LE(worst_p, 1e-5);
  EXPECT_LE(worst_m, 1e-5);
  EXPECT_LE(worst_v, 1e-5);
}

// Weight decay is decoupled: with a zero gradient only the decay moves the parameter.
TEST(Optim, AdamWDecayIsDecoupled) {
  Context ctx;
  ops::AdamWParams p{.lr = 0.1f, .weight_decay = 0.5f, .step = 1};
  Tensor param = Tensor::empty({1}), grad = Tensor::zeros({1}), m = Tensor::zeros({1}),
         v = Tensor::zeros({1});
  param.f32()[0] = 2.f;
  ops::adamw_step(ctx, p, param, grad, m, v);
  EXPECT_FLOAT_EQ(param.f32()[0], 2.f * (1.f - 0.1f * 0.5f));
}

TEST(Optim, ClipGradNormAcrossTensors) {
  Context ctx;
  Rng rng(ctx.rng().next_u64());
  std::vector<Tensor> grads = {Tensor::empty({17}), Tensor::empty({5, 7}), Tensor(),
                               Tensor::empty({1000})};
  for (Tensor& g : grads)
    if (g.defined()) fill_normal(rng, g, 0.5);
  double want_sq = 0;
  std::vector<DVec> before;
  for (const Tensor& g : grads) {
    before.push_back(g.defined() ? to_dvec(g) : DVec{});
    for (double x : before.back()) want_sq += x * x;
  }
  EXPECT_NEAR(norm_sq(ctx, grads), want_sq, 1e-9 * want_sq);

  const double norm = std::sqrt(want_sq);
  // Not clipped when already within the bound, nor when clipping is disabled.
  EXPECT_NEAR(clip(ctx, grads, 2 * norm), norm, 1e-9 * norm);
  EXPECT_NEAR(clip(ctx, grads, 0.0), norm, 1e-9 * norm);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) {
      EXPECT_EQ(rel_err(to_dvec(grads[i]), before[i]), 0.0);
    }
  }

  const double max_norm = norm / 3;
  EXPECT_NEAR(clip(ctx, grads, max_norm), norm, 1e-9 * norm);
  EXPECT_NEAR(std::sqrt(norm_sq(ctx, grads)), max_norm, 1e-5 * max_norm);
  // Every tensor is scaled by the same factor.
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    DVec scaled = before[i];
    for (double& x : scaled) x /= 3;
    EXPECT_LE(rel_err(to_dvec(grads[i]), scaled), 1e-5);
  }
}

}  // namespace
}  // namespace mt::test
