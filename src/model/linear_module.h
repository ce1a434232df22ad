// A projection as layers use it: base weight (HF name "<name>.weight", [out, in]) plus an
// optional LoRA adapter under PEFT names ("<name>.lora_A.weight" [r, in], "<name>.lora_B.weight"
// [out, r]). Wraps ops::linear_*; what backward needs (x, x A^T) is the caller's Saved.
#pragma once

#include <string>
#include <vector>

#include "core/arena.h"
#include "core/context.h"
#include "model/param.h"
#include "ops/linear.h"

namespace mt {

struct LoraSpec {
  int64_t rank = 0;  // 0: no adapter
  float alpha = 16.f;
};

class LinearModule {
 public:
  LinearModule() = default;
  LinearModule(std::string name, int64_t in, int64_t out, LoraSpec lora = {},
               float init_std = 0.02f)
      : name_(std::move(name)), in_(in), out_(out), lora_(lora), std_(init_std) {}

  // Appends "<name>.weight" (and the adapter's two tensors when lora.rank > 0).
  void add_specs(std::vector<ParamSpec>& specs) const;
  void bind(const ParamTable& table);
  // Activation bytes forward saves for `tokens` rows (x A^T when LoRA is on).
  void plan(int64_t tokens, ArenaPlan& plan) const;
  // What forward keeps for backward: a view of x, and x A^T (in `acts`) when LoRA is on.
  struct Saved {
    Tensor x, xa;
  };
  // y [tokens, out] = x [tokens, in] W^T (+ LoRA).
  void forward(Context& ctx, const Tensor& x, Tensor& y, Arena& acts, Saved& s) const;
  // dx written (or added to when accumulate_dx; skipped if undefined); weight grads accumulate.
  void backward(Context& ctx, const Saved& s, const Tensor& dy, Tensor& dx,
                bool accumulate_dx = false);

  const std::string& name() const { return name_; }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  ops::LinearParams params(int64_t tokens) const {
    return {.tokens = tokens,
            .in = in_,
            .out = out_,
            .lora_rank = lora_.rank,
            .lora_alpha = lora_.alpha};
  }
  std::string name_;
  int64_t in_ = 0, out_ = 0;
  LoraSpec lora_;
  float std_ = 0.02f;
  ParamRef w_, a_, b_;
};

}  // namespace mt
