#include "model/vision/biased_linear.h"

#include "ops/bias.h"

namespace mt {

BiasedLinear::BiasedLinear(std::string name, int64_t in, int64_t out, LoraSpec lora)
    : name_(name), out_(out), lin_(std::move(name), in, out, lora) {}

void BiasedLinear::add_specs(std::vector<ParamSpec>& specs) const {
  lin_.add_specs(specs);
  specs.push_back({.name = name_ + ".bias", .shape = {out_}, .init = ParamInit::Zeros});
}

void BiasedLinear::bind(const ParamTable& table) {
  lin_.bind(table);
  b_ = need_param(table, name_ + ".bias", {out_});
}

void BiasedLinear::forward(Context& ctx, const Tensor& x, Tensor& y, Arena& acts,
                           LinearModule::Saved& s) const {
  lin_.forward(ctx, x, y, acts, s);
  ops::bias_add_forward(ctx, b_.value, y);
}

void BiasedLinear::backward(Context& ctx, const LinearModule::Saved& s, const Tensor& dy,
                            Tensor& dx, bool accumulate_dx) {
  if (b_.trainable()) ops::bias_add_backward(ctx, dy, b_.grad);
  lin_.backward(ctx, s, dy, dx, accumulate_dx);
}

}  // namespace mt
