#include "model/vision/vision_block.h"

#include <cmath>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "ops/rope2d.h"

namespace mt {

VisionBlock::VisionBlock(const VisionBlockConfig& cfg)
    : cfg_(cfg),
      q_("attn.q_proj", cfg.hidden, cfg.hidden, cfg.lora),
      k_("attn.k_proj", cfg.hidden, cfg.hidden, cfg.lora),
      v_("attn.v_proj", cfg.hidden, cfg.hidden, cfg.lora),
      proj_("attn.proj", cfg.hidden, cfg.hidden, cfg.lora),
      fc1_("mlp.fc1", cfg.hidden, cfg.intermediate, cfg.lora),
      fc2_("mlp.fc2", cfg.intermediate, cfg.hidden, cfg.lora) {
  MT_CHECK(cfg.hidden > 0 && cfg.heads > 0 && cfg.intermediate > 0, ConfigError,
           "vision block needs hidden, heads and intermediate > 0, got ", cfg.hidden, ", ",
           cfg.heads, ", ", cfg.intermediate);
  MT_CHECK(cfg.hidden % cfg.heads == 0 && cfg.head_dim() % 4 == 0, ConfigError,
           "vision block: hidden ", cfg.hidden, " / heads ", cfg.heads,
           " must be a whole head dimension divisible by 4 (axial 2-D RoPE)");
}

std::vector<ParamSpec> VisionBlock::param_specs() const {
  std::vector<ParamSpec> specs;
  const int64_t D = cfg_.hidden;
  specs.push_back({.name = "norm1.weight", .shape = {D}, .init = ParamInit::Ones});
  specs.push_back({.name = "norm1.bias", .shape = {D}, .init = ParamInit::Zeros});
  q_.add_specs(specs);
  k_.add_specs(specs);
  v_.add_specs(specs);
  proj_.add_specs(specs);
  specs.push_back({.name = "norm2.weight", .shape = {D}, .init = ParamInit::Ones});
  specs.push_back({.name = "norm2.bias", .shape = {D}, .init = ParamInit::Zeros});
  fc1_.add_specs(specs);
  fc2_.add_specs(specs);
  return specs;
}

void VisionBlock::bind(const ParamTable& params) {
  const int64_t D = cfg_.hidden;
  n1w_ = need_param(params, "norm1.weight", {D});
  n1b_ = need_param(params, "norm1.bias", {D});
  n2w_ = need_param(params, "norm2.weight", {D});
  n2b_ = need_param(params, "norm2.bias", {D});
  q_.bind(params);
  k_.bind(params);
  v_.bind(params);
  proj_.bind(params);
  fc1_.bind(params);
  fc2_.bind(params);
}

void VisionBlock::plan_activations(const VisionBatch& batch, ArenaPlan& plan) const {
  const int64_t T = batch.tokens(), D = cfg_.hidden, I = cfg_.intermediate;
  plan.add({T, D});  // h1
  plan.add_fp32({T});
  plan.add_fp32({T});
  q_.plan(T, plan);
  k_.plan(T, plan);
  v_.plan(T, plan);
  for (int i = 0; i < 4; ++i) plan.add({T, D});  // q, k (rotated in place), v, o
  plan.add_fp32({T, cfg_.heads});                // lse
  proj_.plan(T, plan);
  plan.add({T, D});  // x1
  plan.add({T, D});  // h2
  plan.add_fp32({T});
  plan.add_fp32({T});
  fc1_.plan(T, plan);
  plan.add({T, I});  // fc1 output
  plan.add({T, I});  // gelu output
  fc2_.plan(T, plan);
}

void VisionBlock::forward(Context& ctx, const VisionBatch& batch, const Tensor& x, Tensor& y,
                          Arena& acts, Saved& s) const {
  const int64_t T = batch.tokens(), D = cfg_.hidden, I = cfg_.intermediate, H = cfg_.heads,
                Dh = cfg_.head_dim();
  expect_shape(x, {T, D}, "vision block input");
  expect_shape(y, {T, D}, "vision block output");
  const ops::NormParams np{.rows = T, .dim = D, .eps = cfg_.norm_eps};
  const DType at = x.dtype();  // the policy's activations (statistics and lse stay fp32)
  s.x = x;
  s.h1 = acts.alloc({T, D}, at);
  s.mean1 = acts.alloc({T}, DType::F32);
  s.rstd1 = acts.alloc({T}, DType::F32);
  ops::layernorm_forward(ctx, np, x, n1w_.value, n1b_.value, s.h1, s.mean1, s.rstd1);

  s.qr = acts.alloc({T, D}, at);
  s.kr = acts.alloc({T, D}, at);
  s.v_out = acts.alloc({T, D}, at);
  q_.forward(ctx, s.h1, s.qr, acts, s.q);
  k_.forward(ctx, s.h1, s.kr, acts, s.k);
  v_.forward(ctx, s.h1, s.v_out, acts, s.v);
  const ops::Rope2dParams rp{.tokens = T, .heads = H, .head_dim = Dh, .theta = cfg_.rope_theta};
  Tensor q3 = s.qr.view({T, H, Dh}), k3 = s.kr.view({T, H, Dh});
  ops::rope2d_forward(ctx, rp, batch.positions, q3, q3);
  ops::rope2d_forward(ctx, rp, batch.positions, k3, k3);

  s.o = acts.alloc({T, D}, at);
  s.lse = acts.alloc({T, H}, DType::F32);
  Tensor o3 = s.o.view({T, H, Dh});
  ops::attention_forward(ctx, attn_params(batch), q3, k3, s.v_out.view({T, H, Dh}), batch.indices,
                         o3, s.lse);

  s.x1 = acts.alloc({T, D}, at);
  proj_.forward(ctx, s.o, s.x1, acts, s.proj);
  ops::add_into(ctx, x, s.x1);

  s.h2 = acts.alloc({T, D}, at);
  s.mean2 = acts.alloc({T}, DType::F32);
  s.rstd2 = acts.alloc({T}, DType::F32);
  ops::layernorm_forward(ctx, np, s.x1, n2w_.value, n2b_.value, s.h2, s.mean2, s.rstd2);
  s.f = acts.alloc({T, I}, at);
  s.g = acts.alloc({T, I}, at);
  fc1_.forward(ctx, s.h2, s.f, acts, s.fc1);
  ops::gelu_forward(ctx, cfg_.act, s.f, s.g);
  fc2_.forward(ctx, s.g, y, acts, s.fc2);
  ops::add_into(ctx, s.x1, y);
}

void VisionBlock::backward(Context& ctx, const VisionBatch& batch, const Tensor& dy, Tensor& dx,
                           const Saved& s) {
  const int64_t T = batch.tokens(), D = cfg_.hidden, I = cfg_.intermediate, H = cfg_.heads,
                Dh = cfg_.head_dim();
  MT_CHECK(s.g.defined() && s.g.dim(0) == T, InternalError,
           "vision block backward without a matching forward");
  expect_shape(dy, {T, D}, "vision block dy");
  expect_shape(dx, {T, D}, "vision block dx");
  const ops::NormParams np{.rows = T, .dim = D, .eps = cfg_.norm_eps};
  const DType at = dy.dtype();
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();

  // MLP branch: dx1 = dy + ln2'(fc1'(gelu'(fc2'(dy)))).
  Tensor dg = ws.alloc({T, I}, at);
  fc2_.backward(ctx, s.fc2, dy, dg);
  ops::gelu_backward(ctx, cfg_.act, s.f, dg, dg);
  Tensor dh2 = ws.alloc({T, D}, at);
  fc1_.backward(ctx, s.fc1, dg, dh2);
  Tensor dx1 = ws.alloc({T, D}, at);
  ops::layernorm_backward(ctx, np, s.x1, n2w_.value, s.mean2, s.rstd2, dh2, dx1, n2w_.grad,
                          n2b_.grad);
  ops::add_into(ctx, dy, dx1);

  // Attention branch: dx = dx1 + ln1'(q'/k'/v'(...)).
  Tensor d_o = ws.alloc({T, D}, at);
  proj_.backward(ctx, s.proj, dx1, d_o);
  Tensor dq = ws.alloc({T, D}, at), dk = ws.alloc({T, D}, at), dv = ws.alloc({T, D}, at);
  Tensor dq3 = dq.view({T, H, Dh}), dk3 = dk.view({T, H, Dh}), dv3 = dv.view({T, H, Dh});
  ops::attention_backward(ctx, attn_params(batch), s.qr.view({T, H, Dh}), s.kr.view({T, H, Dh}),
                          s.v_out.view({T, H, Dh}), batch.indices, s.o.view({T, H, Dh}), s.lse,
                          d_o.view({T, H, Dh}), dq3, dk3, dv3);
  const ops::Rope2dParams rp{.tokens = T, .heads = H, .head_dim = Dh, .theta = cfg_.rope_theta};
  ops::rope2d_backward(ctx, rp, batch.positions, dq3, dq3);
  ops::rope2d_backward(ctx, rp, batch.positions, dk3, dk3);
  Tensor dh1 = ws.alloc({T, D}, at);
  q_.backward(ctx, s.q, dq, dh1);
  k_.backward(ctx, s.k, dk, dh1, /*accumulate_dx=*/true);
  v_.backward(ctx, s.v, dv, dh1, /*accumulate_dx=*/true);
  ops::layernorm_backward(ctx, np, s.x, n1w_.value, s.mean1, s.rstd1, dh1, dx, n1w_.grad,
                          n1b_.grad);
  ops::add_into(ctx, dx1, dx);
}

ops::AttentionParams VisionBlock::attn_params(const VisionBatch& batch) const {
  const int64_t Dh = cfg_.head_dim();
  return {.tokens = batch.tokens(),
          .heads = cfg_.heads,
          .qk_dim = Dh,
          .v_dim = Dh,
          .kmax = batch.kmax,
          .scale = 1.f / std::sqrt(static_cast<float>(Dh))};
}

}  // namespace mt
