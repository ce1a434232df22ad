#include "model/linear_module.h"

namespace mt {

void LinearModule::add_specs(std::vector<ParamSpec>& specs) const {
  specs.push_back({.name = name_ + ".weight",
                   .shape = {out_, in_},
                   .init = ParamInit::Normal,
                   .std = std_,
                   .role = ParamRole::Dense});
  if (lora_.rank > 0) {
    // PEFT starts the adapter as an exact no-op: A random, B zero.
    specs.push_back({.name = name_ + ".lora_A.weight",
                     .shape = {lora_.rank, in_},
                     .init = ParamInit::Normal,
                     .std = std_,
                     .role = ParamRole::Lora});
    specs.push_back({.name = name_ + ".lora_B.weight",
                     .shape = {out_, lora_.rank},
                     .init = ParamInit::Zeros,
                     .role = ParamRole::Lora});
  }
}

void LinearModule::bind(const ParamTable& table) {
  w_ = need_param(table, name_ + ".weight", {out_, in_});
  if (lora_.rank > 0) {
    a_ = need_param(table, name_ + ".lora_A.weight", {lora_.rank, in_});
    b_ = need_param(table, name_ + ".lora_B.weight", {out_, lora_.rank});
  }
}

void LinearModule::plan(int64_t tokens, ArenaPlan& plan) const {
  if (lora_.rank > 0) plan.add({tokens, lora_.rank});
}

void LinearModule::forward(Context& ctx, const Tensor& x, Tensor& y, Arena& acts, Saved& s) const {
  MT_CHECK(w_.value.defined(), InternalError, "linear '", name_, "' used before bind");
  MT_CHECK(x.ndim() == 2, ShapeError, "linear '", name_, "' input has shape ", x.shape(),
           ", expected [tokens, ", in_, "]");
  const int64_t tokens = x.dim(0);
  s.x = x;
  s.xa = lora_.rank > 0 ? acts.alloc({tokens, lora_.rank}, x.dtype()) : Tensor();
  ops::linear_forward(ctx, params(tokens), x, w_.value, a_.value, b_.value, y, s.xa);
}

void LinearModule::backward(Context& ctx, const Saved& s, const Tensor& dy, Tensor& dx,
                            bool accumulate_dx) {
  MT_CHECK(s.x.defined(), InternalError, "linear '", name_, "' backward without forward");
  ops::linear_backward(ctx, params(s.x.dim(0)), s.x, w_.value, a_.value, b_.value, s.xa, dy, dx,
                       w_.grad, a_.grad, b_.grad, accumulate_dx);
}

}  // namespace mt
