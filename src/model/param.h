// Parameters as layers see them. A layer declares what it needs (ParamSpec: local name, shape,
// initialisation) and is bound to tensors by name (ParamTable). The model binds layers to its
// ParamStore under HF names ("model.layers.3.self_attn.q_proj.weight"); tests bind them to their
// own tensors. A frozen parameter has an undefined grad.
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "model/precision.h"

namespace mt {

enum class ParamInit { Normal, Zeros, Ones, Custom };

enum class ParamRole {
  Dense,   // sharded with FSDP
  Expert,  // routed-expert weight, split across EP ranks
  Lora,    // adapter (trainable even when the base is frozen)
  Buffer,  // state updated outside the optimizer (e.g. the aux-loss-free router bias)
};

struct ParamSpec {
  std::string name;  // local to the layer, e.g. "q_proj.weight"
  Shape shape;
  ParamInit init = ParamInit::Normal;
  float std = 0.02f;
  std::function<void(Rng&, Tensor&)> custom;  // for ParamInit::Custom
  ParamRole role = ParamRole::Dense;
  // Storage dtype of the value. Layers leave it; the model sets it from its precision policy
  // (param_dtype) before allocating, and model_param_specs reports it, so that counts and plans
  // see the bytes the store holds. Gradients, masters and moments are fp32 regardless.
  DType dtype = DType::F32;
  // Dim 0 indexes the routed experts, so expert parallelism splits it across EP ranks: the
  // Expert weights and their LoRA adapters (role Lora: trainable under a frozen base).
  bool per_expert = false;
  // Stored fp32 under every policy because its kernel reads it in fp32 (KDA's A_log and dt_bias
  // feed the decay, which stays fp32). It trains as usual; the value is its own master.
  bool keep_fp32 = false;
};

// The storage dtype of a parameter under a policy: the policy's weight dtype, except buffers and
// keep_fp32 parameters, which stay fp32.
DType param_dtype(const ParamSpec& spec, const Precision& precision);

struct ParamRef {
  Tensor value;
  Tensor grad;  // undefined: frozen (no gradient is computed for it)
  // The parameter's "gradient holds zeros" flag (ParamStore::zero_grad sets it; null: unknown). A
  // layer whose backward is the gradient's only writer may take it and write instead of adding.
  bool* grad_zero = nullptr;
  bool trainable() const { return grad.defined(); }
};

using ParamTable = std::unordered_map<std::string, ParamRef>;

// The tensors of `name`, checked against `shape`; ConfigError naming the parameter if missing.
ParamRef need_param(const ParamTable& table, const std::string& name, const Shape& shape);
// Like need_param but returns an empty ParamRef when the table has no such entry.
ParamRef optional_param(const ParamTable& table, const std::string& name, const Shape& shape);

// Fills a tensor according to its spec (drawn in fp32, then rounded when the tensor is bf16, so
// that every policy starts from the same values up to rounding).
void init_param(const ParamSpec& spec, Rng& rng, Tensor& t);

}  // namespace mt
