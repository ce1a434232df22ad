// Exports a checkpoint for other tools. "peft": the LoRA adapters in HF PEFT layout
// (adapter_config.json + adapter_model.safetensors, keys "base_model.model.<param>" with
// lora_A [r, in] / lora_B [out, r], written by write_peft_adapter, io/hf_adapter.h); per-group
// ranks go to rank_pattern / alpha_pattern, target_modules lists full module paths. Routed
// expert adapters have no PEFT equivalent and are written under their own names
// (experts.{gate_up,down}_lora_{A,B}, leading expert dimension). "hf": merged weights
// W + (alpha / r) B A with the base config.json, loadable as a model directory; for an HF
// family (the job's model.dir) in that family's checkpoint layout, which transformers loads.
#pragma once

#include <string>

#include "io/hf_names.h"

namespace mt {

// Returns a one-line summary (tensor count, bytes).
std::string export_checkpoint(const std::string& checkpoint, const std::string& format,
                              const std::string& out_dir);

// Rewrites an HF model directory (streamed in; FP8 dequantised) as an f32 "hf" directory.
std::string export_model_dir(const std::string& dir, const std::string& format,
                             const std::string& out_dir, const ProgressFn& progress = {});

}  // namespace mt
