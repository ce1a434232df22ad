#include "io/hf_adapter.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/rng.h"

namespace mt {

namespace fs = std::filesystem;

LoraTargets parse_lora_targets(const std::string& list, int64_t rank, float alpha) {
  MT_CHECK(rank > 0 && alpha > 0, ValueError, "LoRA rank ", rank, " and alpha ", alpha,
           " must be positive");
  LoraTargets t;
  t.rank = rank;
  t.alpha = alpha;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "attention") {
      t.attention = true;
    } else if (item == "kda") {
      t.kda = true;
    } else if (item == "shared_experts") {
      t.shared_experts = true;
    } else if (item == "dense_ffn") {
      t.dense_ffn = true;
    } else if (item == "routed_experts") {
      MT_THROW(ValueError,
               "LoRA target 'routed_experts': transformers keeps routed experts as fused 3-D "
               "parameters, which HF PEFT's LoRA cannot load");
    } else {
      MT_THROW(ValueError, "unknown LoRA target '", item,
               "' (attention, kda, shared_experts, dense_ffn)");
    }
  }
  return t;
}

LoadedModel load_hf_model_with_lora(const std::string& dir, const LoraTargets& t) {
  LoadedModel lm;
  lm.config = load_hf_config(dir);
  ModelConfig& c = lm.config.model;
  const LoraSpec spec{.rank = t.rank, .alpha = t.alpha};
  if (t.attention) c.mla.lora = c.dsa.mla.lora = spec;
  if (t.kda) c.kda.lora = spec;
  if (t.shared_experts) c.moe.lora = spec;
  if (t.dense_ffn) c.dense.lora = spec;
  SafetensorsModel st(dir, fp8_blocks(lm.config));
  lm.model = std::make_unique<Model>(c, /*seed=*/0);
  // The checkpoint has no adapter tensors: the fresh ones stay.
  import_hf_tensors(*lm.model, lm.config.model_type, st, dir, {.keep_lora = true});
  return lm;
}

void randomize_lora(Model& m, uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : m.params().all()) {
    if (p->spec.role != ParamRole::Lora) continue;
    Tensor& v = p->value;
    const double sd = 1.0 / std::sqrt(static_cast<double>(v.dim(v.ndim() - 1)));
    float* d = v.f32();
    for (int64_t i = 0; i < v.numel(); ++i) d[i] = static_cast<float>(sd * rng.normal());
  }
}

size_t write_peft_adapter(const Model& m, const std::string& model_type, const PeftInfo& info,
                          const std::string& dir) {
  TensorMap out;
  std::set<std::string> modules;
  nlohmann::json rank_pattern = nlohmann::json::object(), alpha_pattern = nlohmann::json::object();
  const std::string marker = ".lora_A.weight";
  for (const auto& p : m.params().all()) {
    if (p->spec.role != ParamRole::Lora) continue;
    // Routed-expert adapters have no PEFT equivalent; they keep their own names.
    const std::string hf = hf_runtime_name(model_type, p->name);
    out["base_model.model." + hf] = p->value;
    // Routed experts are outside target_modules, but their rank and alpha must survive the
    // round trip: recorded under the experts' module name, which PEFT matches to nothing.
    if (const std::string ge = ".gate_up_lora_A"; p->name.ends_with(".mlp.experts" + ge)) {
      const std::string mod = hf.substr(0, hf.size() - ge.size());
      if (p->value.dim(1) != info.r) rank_pattern[mod] = p->value.dim(1);
      const float al = info.alpha_of ? info.alpha_of(p->name) : info.alpha;
      if (al != info.alpha) alpha_pattern[mod] = al;
    }
    if (!p->name.ends_with(marker)) continue;
    const std::string mod = p->name.substr(0, p->name.size() - marker.size());
    const std::string hf_mod = hf.substr(0, hf.size() - marker.size());
    modules.insert(hf_mod);
    // PEFT matches pattern keys as regexes against module names; full names are literal
    // enough (dots match themselves).
    if (p->value.dim(0) != info.r) rank_pattern[hf_mod] = p->value.dim(0);
    const float al = info.alpha_of ? info.alpha_of(mod) : info.alpha;
    if (al != info.alpha) alpha_pattern[hf_mod] = al;
  }
  MT_CHECK(!out.empty(), ValueError, "the model has no LoRA adapters to export");
  fs::create_directories(dir);
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), out,
                    {{"format", "pt"}});
  const nlohmann::json cfg = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", info.base_model},
      {"r", info.r},
      {"lora_alpha", info.alpha},
      {"lora_dropout", 0.0},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", false},
      {"inference_mode", true},
      {"target_modules", std::vector<std::string>(modules.begin(), modules.end())},
      {"rank_pattern", rank_pattern},
      {"alpha_pattern", alpha_pattern}};
  const fs::path tmp = fs::path(dir) / "adapter_config.json.tmp";
  std::ofstream(tmp) << cfg.dump(2) << "\n";
  fs::rename(tmp, fs::path(dir) / "adapter_config.json");
  return out.size();
}

}  // namespace mt
