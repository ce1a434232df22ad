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
  // Both SwiGLU inputs, its output (the input down_proj keeps a view of), the projections' own.
  struct Saved : LayerState {
    Tensor gate_out, up_out, act;
    LinearModule::Saved gate, up, down;
  };
  std::unique_ptr<LayerState> make_state() const override { return std::make_unique<Saved>(); }
  void forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
               LayerState& st) override;
  void backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                LayerState& st) override;
  // Inference only (decode/decode.h): y = forward(x) for x [n, hidden] (one document `seq`),
  // its saved activations in `acts` (grown to fit, reset by each call).
  void decode_step(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts);

 private:
  DenseFfnConfig cfg_;
  LinearModule gate_, up_, down_;
};

}  // namespace mt
