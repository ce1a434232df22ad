#include "model/dense_ffn.h"

#include "ops/activation.h"

namespace mt {

DenseFfn::DenseFfn(const DenseFfnConfig& cfg)
    : cfg_(cfg),
      gate_("gate_proj", cfg.hidden, cfg.ffn, cfg.lora),
      up_("up_proj", cfg.hidden, cfg.ffn, cfg.lora),
      down_("down_proj", cfg.ffn, cfg.hidden, cfg.lora) {
  MT_CHECK(cfg.hidden > 0 && cfg.ffn > 0, ConfigError,
           "dense FFN needs hidden > 0 and ffn > 0, got ", cfg.hidden, " and ", cfg.ffn);
  MT_CHECK(cfg.lora.rank >= 0, ConfigError, "dense FFN LoRA rank must be >= 0, got ",
           cfg.lora.rank);
}

std::vector<ParamSpec> DenseFfn::param_specs() const {
  std::vector<ParamSpec> specs;
  gate_.add_specs(specs);
  up_.add_specs(specs);
  down_.add_specs(specs);
  return specs;
}

void DenseFfn::bind(const ParamTable& params) {
  gate_.bind(params);
  up_.bind(params);
  down_.bind(params);
}

void DenseFfn::plan_activations(const SeqInfo& seq, ArenaPlan& plan) const {
  const int64_t T = seq.tokens;
  gate_.plan(T, plan);
  up_.plan(T, plan);
  for (int i = 0; i < 3; ++i) plan.add({T, cfg_.ffn});  // gate, up, silu(gate) * up
  down_.plan(T, plan);
}

void DenseFfn::forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts) {
  const int64_t T = seq.tokens;
  expect_shape(x, {T, cfg_.hidden}, "dense FFN input");
  expect_shape(y, {T, cfg_.hidden}, "dense FFN output");
  const DType at = x.dtype();
  gate_out_ = acts.alloc({T, cfg_.ffn}, at);
  up_out_ = acts.alloc({T, cfg_.ffn}, at);
  act_ = acts.alloc({T, cfg_.ffn}, at);
  gate_.forward(ctx, x, gate_out_, acts);
  up_.forward(ctx, x, up_out_, acts);
  ops::swiglu_forward(ctx, gate_out_, up_out_, act_);
  down_.forward(ctx, act_, y, acts);
}

void DenseFfn::backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx) {
  const int64_t T = seq.tokens;
  MT_CHECK(act_.defined() && act_.dim(0) == T, InternalError,
           "dense FFN backward without a matching forward");
  expect_shape(dy, {T, cfg_.hidden}, "dense FFN dy");
  expect_shape(dx, {T, cfg_.hidden}, "dense FFN dx");
  ArenaScope scope(ctx.workspace());
  const DType at = act_.dtype();
  Tensor dact = ctx.workspace().alloc({T, cfg_.ffn}, at);
  Tensor dgate = ctx.workspace().alloc({T, cfg_.ffn}, at);
  Tensor dup = ctx.workspace().alloc({T, cfg_.ffn}, at);
  down_.backward(ctx, dy, dact);
  ops::swiglu_backward(ctx, gate_out_, up_out_, dact, dgate, dup);
  gate_.backward(ctx, dgate, dx);
  up_.backward(ctx, dup, dx, /*accumulate_dx=*/true);  // x feeds both projections
}

}  // namespace mt
