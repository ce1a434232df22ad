// Dense SwiGLU feed-forward block: y = down(silu(gate(x)) * up(x)), HF names gate_proj, up_proj,
// down_proj, each a LinearModule (so LoRA applies to all three when cfg.lora.rank > 0).
#pragma once

#include <vector>

#include "model/config.h"
#include "model/layer.h"
#include "model/linear_module.h"

namespace mt {

class DenseFfn : public Layer {
 public:
  explicit DenseFfn(const DenseFfnConfig& cfg);

  std::vector<ParamSpec> param_specs() const override;
  void bind(const ParamTable& params) override;
  void plan_activations(const SeqInfo& seq, ArenaPlan& plan) const override;
  void forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts) override;
  void backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx) override;
  // Inference only (decode/decode.h): y = forward(x) for x [n, hidden].
  void decode_step(Context& ctx, const Tensor& x, Tensor& y);

 private:
  DenseFfnConfig cfg_;
  LinearModule gate_, up_, down_;
  // Saved for backward: both SwiGLU inputs, and its output (the input down_proj keeps a view of).
  Tensor gate_out_, up_out_, act_;
};

}  // namespace mt
