// The interface every layer of the model implements: explicit forward and backward, no tape.
//
// Contract:
// - forward(x) -> y writes y. It may keep views of x (the caller keeps x alive until backward)
//   and saves everything else backward needs into `acts`, an arena the caller sized with
//   plan_activations() for the same SeqInfo (and does not reset before backward).
// - backward(dy) -> dx writes dx (activation gradient) and *adds* parameter gradients into the
//   bound grad tensors (frozen parameters have none and get none). Auxiliary losses the layer
//   owns (indexer KL, router aux/z-loss) add their own gradients here with their coefficients.
// - Scratch comes from ctx.workspace() inside an ArenaScope.
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/context.h"
#include "core/seq_info.h"
#include "model/param.h"

namespace mt {

// An auxiliary loss as read on the host (after the step).
struct AuxLoss {
  std::string name;   // "indexer_kl", "router_seq_aux", "router_z"
  double value = 0;   // unweighted
  double weight = 0;  // coefficient its gradient is applied with in backward
};

// An auxiliary loss as a forward leaves it: its op writes `value` (f64 [1], on the layer's
// device) and nobody reads it until the step is over, so no forward waits for the device.
struct AuxTerm {
  const char* name = "";
  Tensor value;
  double weight = 0;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::vector<ParamSpec> param_specs() const = 0;
  virtual void bind(const ParamTable& params) = 0;
  virtual void plan_activations(const SeqInfo& seq, ArenaPlan& plan) const = 0;
  virtual void forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y,
                       Arena& acts) = 0;
  virtual void backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx) = 0;
  // Auxiliary losses of the last forward, as tensors (persistent: the same tensors every step).
  virtual std::span<const AuxTerm> aux_terms() const { return {}; }
  // The same read on the host (a synchronisation point: tests and reports, not the step).
  std::vector<AuxLoss> aux_losses() const {
    std::vector<AuxLoss> out;
    for (const AuxTerm& a : aux_terms())
      out.push_back({a.name, a.value.defined() ? read_scalar(a.value) : 0.0, a.weight});
    return out;
  }
};

}  // namespace mt
