// Exports a checkpoint for other tools. "peft": the LoRA adapters in HF PEFT layout
// (adapter_config.json + adapter_model.safetensors, keys "base_model.model.<param>" with
// lora_A [r, in] / lora_B [out, r], written by write_peft_adapter, io/hf_adapter.h); per-group
// ranks go to rank_pattern / alpha_pattern, target_modules lists full module paths. Routed
// expert adapters have no PEFT equivalent and are written under their own names
// (experts.{gate_up,down}_lora_{A,B}, leading expert dimension). "hf": merged weights
// W + (alpha / r) B A with the base config.json, loadable as a model directory.
#pragma once

#include <string>

namespace mt {

// Returns a one-line summary (tensor count, bytes).
std::string export_checkpoint(const std::string& checkpoint, const std::string& format,
                              const std::string& out_dir);

}  // namespace mt
