// LoRA adapters on HuggingFace model types (kimi_linear, deepseek_v32) in HF PEFT's layout, so
// an adapter trained or drawn here loads with `PeftModel.from_pretrained` on the transformers
// model: keys "base_model.model.<transformers module>.lora_{A,B}.weight", A [r, in], B [out, r],
// scaling lora_alpha / r. Routed experts are fused 3-D parameters in transformers: their adapters
// go to PEFT's target_parameters (ParamWrapper layout), as do the deepseek types' MLP projections
// (PEFT 0.21 would retarget them as modules), so PeftModel.from_pretrained loads everything as is.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "io/hf_names.h"

namespace mt {

struct LoraTargets {
  bool attention = false;       // MLA / DSA projections (the DSA indexer's included)
  bool kda = false;             // every KDA projection
  bool shared_experts = false;  // the shared experts' gate/up/down
  bool dense_ffn = false;       // dense MLP layers
  bool routed_experts = false;  // every routed expert's gate_up / down
  int64_t rank = 4;
  float alpha = 8.f;
};

// "attention,kda,shared_experts,routed_experts,dense_ffn" (any subset).
LoraTargets parse_lora_targets(const std::string& list, int64_t rank, float alpha);

// load_hf_model with adapters attached (A random, B zero, as a fresh adapter).
LoadedModel load_hf_model_with_lora(const std::string& dir, const LoraTargets& targets);

// Redraws every adapter tensor (B included) from N(0, 1/fan_in), so the adapter changes the
// output measurably; for conformance checks, not training.
void randomize_lora(Model& m, uint64_t seed);

struct PeftInfo {
  int64_t r = 8;  // the adapter_config default; other ranks go to rank_pattern
  float alpha = 16.f;
  // Alpha of one module ("model.layers.3.self_attn.o_proj", engine name; for routed experts
  // the parameter name "...mlp.experts.gate_up_lora_A"); others differing from `alpha` go to
  // alpha_pattern. Empty: `alpha` everywhere.
  std::function<float(const std::string& module)> alpha_of;
  std::string base_model;  // base_model_name_or_path
};

// Writes DIR/adapter_model.safetensors and DIR/adapter_config.json; returns the tensor count.
// Module names are mapped to transformers' runtime names for `model_type` (kimi's forget-gate
// projections move under self_attn.forget_gate); target_modules lists full module paths so no
// other module with the same leaf name gets adapted.
size_t write_peft_adapter(const Model& m, const std::string& model_type, const PeftInfo& info,
                          const std::string& dir);

}  // namespace mt
