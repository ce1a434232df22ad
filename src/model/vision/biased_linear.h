// A projection with a bias, as every linear layer of the vision tower and the projector has:
// LinearModule ("<name>.weight", optional LoRA under PEFT names) plus "<name>.bias" [out]. The
// bias is a Dense parameter, frozen with the base when only adapters train.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/linear_module.h"

namespace mt {

class BiasedLinear {
 public:
  BiasedLinear() = default;
  BiasedLinear(std::string name, int64_t in, int64_t out, LoraSpec lora = {});

  void add_specs(std::vector<ParamSpec>& specs) const;
  void bind(const ParamTable& table);
  void plan(int64_t tokens, ArenaPlan& plan) const { lin_.plan(tokens, plan); }
  // y [tokens, out] = x W^T + b (+ LoRA). `s` (the caller's) keeps a view of x.
  void forward(Context& ctx, const Tensor& x, Tensor& y, Arena& acts, LinearModule::Saved& s) const;
  // dx written (added to when accumulate_dx; skipped if undefined); weight and bias grads
  // accumulate.
  void backward(Context& ctx, const LinearModule::Saved& s, const Tensor& dy, Tensor& dx,
                bool accumulate_dx = false);

 private:
  std::string name_;
  int64_t out_ = 0;
  LinearModule lin_;
  ParamRef b_;
};

}  // namespace mt
