// Applies a LoRA adapter in the HF PEFT layout that `moetrain export --format peft` writes
// (adapter_config.json + adapter_model.safetensors, keys "base_model.model.<param>") to a base
// model, for generation and evaluation without the training checkpoint. The adapter's ranks and
// alphas come from adapter_config.json (r / lora_alpha, rank_pattern / alpha_pattern per module);
// the engine keeps one LoraSpec per target group, so modules of a group must agree.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"
#include "train/job.h"

namespace mt {

// A copy of `base` (built from `base_job`: its model and seed) with the adapter in `dir`
// attached. ConfigError, naming the key or module, for: an adapter written for another base
// model (base_model_name_or_path), a module the base lacks, a missing or unexpected tensor, a
// tensor whose shape differs from the base model's, a rank that contradicts adapter_config.json,
// and differing ranks or alphas within one target group. A base that already carries adapters
// is refused (the adapter would replace them silently).
std::unique_ptr<Model> apply_peft_adapter(const Model& base, const Job& base_job,
                                          const std::string& dir);

}  // namespace mt
