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

void DenseFfn::forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
                       LayerState& st) {
  Saved& s = state_as<Saved>(st, "dense FFN");
  const int64_t T = seq.tokens;
  expect_shape(x, {T, cfg_.hidden}, "dense FFN input");
  expect_shape(y, {T, cfg_.hidden}, "dense FFN output");
  const DType at = x.dtype();
  s.gate_out = acts.alloc({T, cfg_.ffn}, at);
  s.up_out = acts.alloc({T, cfg_.ffn}, at);
  s.act = acts.alloc({T, cfg_.ffn}, at);
  gate_.forward(ctx, x, s.gate_out, acts, s.gate);
  up_.forward(ctx, x, s.up_out, acts, s.up);
  ops::swiglu_forward(ctx, s.gate_out, s.up_out, s.act);
  down_.forward(ctx, s.act, y, acts, s.down);
}

void DenseFfn::backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                        LayerState& st) {
  const Saved& s = state_as<Saved>(st, "dense FFN");
  const int64_t T = seq.tokens;
  MT_CHECK(s.act.defined() && s.act.dim(0) == T, InternalError,
           "dense FFN backward without a matching forward");
  expect_shape(dy, {T, cfg_.hidden}, "dense FFN dy");
  expect_shape(dx, {T, cfg_.hidden}, "dense FFN dx");
  ArenaScope scope(ctx.workspace());
  const DType at = s.act.dtype();
  Tensor dact = ctx.workspace().alloc({T, cfg_.ffn}, at);
  Tensor dgate = ctx.workspace().alloc({T, cfg_.ffn}, at);
  Tensor dup = ctx.workspace().alloc({T, cfg_.ffn}, at);
  down_.backward(ctx, s.down, dy, dact);
  ops::swiglu_backward(ctx, s.gate_out, s.up_out, dact, dgate, dup);
  gate_.backward(ctx, s.gate, dgate, dx);
  up_.backward(ctx, s.up, dup, dx, /*accumulate_dx=*/true);  // x feeds both projections
}

}  // namespace mt
