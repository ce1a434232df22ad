// The interface every layer of the model implements: explicit forward and backward, no tape.
//
// Contract:
// - forward(x) -> y writes y. Everything backward needs goes into `st`, a state the caller owns
//   (make_state(), one per micro-batch in flight): views of x (the caller keeps x alive until
//   backward) and of `acts`, an arena the caller sized with plan_activations() for the same
//   SeqInfo (and does not reset before backward). Forward changes no member of the layer that
//   backward reads, so several forwards may be in flight, each with its own state and arena.
// - backward(dy, st) -> dx writes dx (activation gradient) and *adds* parameter gradients into
//   the bound grad tensors (frozen parameters have none and get none). Auxiliary losses the layer
//   owns (indexer KL, router aux/z-loss) add their own gradients here with their coefficients.
// - Readouts of the last forward (aux loss values, expert ids, loads) stay members: backward
//   never reads them.
// - Scratch comes from ctx.workspace() inside an ArenaScope.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/context.h"
#include "core/error.h"
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

// What one forward saves for its backward. Each layer kind derives its own (e.g.
// KdaLayer::Saved); the caller holds one per micro-batch in flight and hands it to both calls.
struct LayerState {
  virtual ~LayerState() = default;
  // Set by forward's caller: backward will consume this forward (Model::Pass::Train). A layer may
  // then leave to backward what only a readout needs from forward and backward can form more
  // cheaply (DsaLayer's KL loss: its target falls out of the attention backward). False: forward
  // leaves every readout (aux_terms) written, as an evaluation or a test that reads it expects.
  bool backward_follows = false;
  // Set by forward's caller: no backward will consume this forward (Model::Pass::Eval). A layer
  // may then skip what only backward reads (KdaLayer: the core's chunk states and prepared
  // blocks); its backward must not be called.
  bool no_backward = false;
};

// `st` as the state type S of `layer`; a state made by another layer kind is a ValueError.
// Base: LayerState, or another state hierarchy (ExpertState).
template <class S, class Base>
S& state_as(Base& st, const char* layer) {
  auto* s = dynamic_cast<S*>(&st);
  MT_CHECK(s != nullptr, ValueError, layer, ": the state was made by another layer kind");
  return *s;
}

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::vector<ParamSpec> param_specs() const = 0;
  virtual void bind(const ParamTable& params) = 0;
  virtual void plan_activations(const SeqInfo& seq, ArenaPlan& plan) const = 0;
  // An empty state for forward to fill (allocated once per micro-batch slot, reused every step).
  virtual std::unique_ptr<LayerState> make_state() const = 0;
  virtual void forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
                       LayerState& st) = 0;
  virtual void backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                        LayerState& st) = 0;
  // Auxiliary losses of the last forward, as tensors (persistent: the same tensors every step).
  // A layer that leaves one to backward (LayerState::backward_follows) writes it there.
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
