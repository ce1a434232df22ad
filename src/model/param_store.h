// ParamStore: every parameter of a model under its HF name, its value in the spec's dtype (the
// precision policy's, set by the model) and its gradient (fp32) when trainable. Owns the memory;
// layers see it through ParamTables of their own local names.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/param.h"

namespace mt {

struct Param {
  std::string name;  // full HF name, e.g. "model.layers.3.mlp.gate.weight"
  ParamSpec spec;    // spec.name is the layer-local name
  Tensor value;
  Tensor grad;  // undefined when frozen
  // Set by ParamStore::zero_grad: grad holds zeros and nothing has written it since. The layer
  // that owns the parameter may clear it in its backward and write the gradient (=) instead of
  // adding into it (MoeLayer's expert weights: a dW GEMM that skips reading an f32 buffer).
  bool grad_zero = false;
  bool trainable() const { return grad.defined(); }
  ParamRef ref() { return {value, grad, &grad_zero}; }
};

// A deferred parameter's value before a mesh slices it: a shape with no storage.
inline bool is_placeholder(const Tensor& t) {
  return t.numel() > 0 && t.raw() == nullptr;
}

class ParamStore {
 public:
  // Parameters live on `device`; they are initialised on the host (the same draws on every
  // device, so a GPU model starts from the CPU model's values) and copied there.
  explicit ParamStore(Device device = Device::CPU) : device_(device) {}
  Device device() const { return device_; }
  // Benchmarks of models with billions of parameters: a Normal-initialised tensor of more than
  // 2^24 elements repeats one block of 2^20 draws instead of drawing every element (host
  // initialisation of a 14B-parameter model would take minutes; speed does not depend on the
  // values, and router weights, being small, are drawn in full).
  void set_tiled_init(bool on) { tiled_init_ = on; }
  // Base weights that a loader will overwrite once a mesh has sliced them (ModelOptions::
  // defer_weights): Dense and Expert parameters with a Normal, Zeros or Ones initialisation get a
  // placeholder value (shape and dtype, no storage: see is_placeholder) and, when trainable, an
  // untouched gradient allocation; the RNG advances exactly as if they were drawn, so every
  // other parameter gets the values of an ordinary build.
  void set_deferred(bool on) { deferred_ = on; }
  // Moves every value and gradient to `device` (layers holding refs must rebind).
  void to_device(Device device);

  // Allocates (and initialises from rng) the parameters a layer declares, under prefix + local
  // name; `trainable(spec)` decides whether a gradient buffer exists. Returns the layer's table.
  ParamTable add_layer(const std::string& prefix, const std::vector<ParamSpec>& specs, Rng& rng,
                       const std::function<bool(const ParamSpec&)>& trainable);

  Param& at(const std::string& name);
  const Param* find(const std::string& name) const;
  const std::vector<std::unique_ptr<Param>>& all() const { return params_; }

  void zero_grad();
  int64_t count(bool trainable_only = false) const;
  std::vector<Tensor> grads() const;  // of trainable parameters, in order
  // The same into out, reusing its capacity (no allocation once it has held them).
  void grads(std::vector<Tensor>& out) const;

 private:
  Device device_;
  bool tiled_init_ = false;
  bool deferred_ = false;
  std::vector<std::unique_ptr<Param>> params_;
  std::map<std::string, Param*> by_name_;
};

}  // namespace mt
