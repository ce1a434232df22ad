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
      t.routed_experts = true;
    } else {
      MT_THROW(ValueError, "unknown LoRA target '", item,
               "' (attention, kda, shared_experts, routed_experts, dense_ffn)");
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
  if (t.routed_experts) c.moe.expert_lora = spec;
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

namespace {

// PEFT's ParamWrapper layout for LoRA on a fused expert parameter W [E, out, in]: lora_A
// [E*r, in] (expert e's A in rows e*r ..), lora_B [out, r*E] with B_e[o, k] at column k*E + e;
// W_e += (alpha / r) B_e A_e. The engine keeps A [E, r, in] (the same bytes) and B [E, out, r].
Tensor peft_expert_b(const Tensor& b) {
  const int64_t E = b.dim(0), out = b.dim(1), r = b.dim(2);
  Tensor t = Tensor::empty({out, r * E});
  const float* src = b.f32();
  float* dst = t.f32();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k) dst[o * r * E + k * E + e] = src[(e * out + o) * r + k];
  return t;
}

// transformers maps the deepseek types' MLP projections (dense, shared experts) to fused routed
// experts when PEFT 0.21 converts target_modules (v4 -> v5 checkpoint conversion of qwen2_moe);
// as target_parameters ("<module>.weight") they are left alone and load where written.
bool mlp_as_parameter(const std::string& model_type, const std::string& hf_module) {
  if (model_type != "deepseek_v3" && model_type != "deepseek_v32") return false;
  if (hf_module.find(".mlp.") == std::string::npos) return false;
  for (const char* leaf : {".gate_proj", ".up_proj", ".down_proj"})
    if (hf_module.ends_with(leaf)) return true;
  return false;
}

}  // namespace

size_t write_peft_adapter(const Model& m, const std::string& model_type, const PeftInfo& info,
                          const std::string& dir) {
  TensorMap out;
  std::set<std::string> modules, parameters;
  nlohmann::json rank_pattern = nlohmann::json::object(), alpha_pattern = nlohmann::json::object();
  const std::string marker = ".lora_A.weight";
  const bool hf_family = model_type != "moetrain_hybrid";
  for (const auto& p : m.params().all()) {
    if (p->spec.role != ParamRole::Lora) continue;
    const std::string hf = hf_runtime_name(model_type, p->name);
    // Routed experts of an HF family: PEFT target_parameters on the fused expert weights. With
    // both of a module's parameters adapted, PEFT nests the wrappers, gate_up_proj innermost:
    // its tensors sit under "experts.base_layer.", down_proj's under "experts.".
    if (const size_t at = p->name.find(".mlp.experts."); hf_family && at != std::string::npos) {
      const std::string rest = p->name.substr(at + 13);  // gate_up_lora_A, down_lora_B, ...
      const bool gate_up = rest.starts_with("gate_up_");
      const std::string which = gate_up ? "gate_up_proj" : "down_proj";
      const std::string param = hf_runtime_name(model_type, p->name.substr(0, at + 13) + which);
      const std::string mod = param.substr(0, param.size() - which.size() - 1);
      const bool is_a = rest.ends_with("_A");
      out["base_model.model." + mod + (gate_up ? ".base_layer" : "") +
          (is_a ? ".lora_A.weight" : ".lora_B.weight")] =
          is_a ? p->value.clone().view({p->value.dim(0) * p->value.dim(1), p->value.dim(2)})
               : peft_expert_b(p->value);
      if (!is_a) continue;
      parameters.insert(param);
      if (p->value.dim(1) != info.r) rank_pattern[param] = p->value.dim(1);
      const float al = info.alpha_of ? info.alpha_of(p->name) : info.alpha;
      if (al != info.alpha) alpha_pattern[param] = al;
      continue;
    }
    out["base_model.model." + hf] = p->value;
    // Hybrid routed experts are outside target_modules, but their rank and alpha must survive
    // the round trip: recorded under the experts' module name, which PEFT matches to nothing.
    if (const std::string ge = ".gate_up_lora_A"; p->name.ends_with(".mlp.experts" + ge)) {
      const std::string mod = hf.substr(0, hf.size() - ge.size());
      if (p->value.dim(1) != info.r) rank_pattern[mod] = p->value.dim(1);
      const float al = info.alpha_of ? info.alpha_of(p->name) : info.alpha;
      if (al != info.alpha) alpha_pattern[mod] = al;
    }
    if (!p->name.ends_with(marker)) continue;
    const std::string mod = p->name.substr(0, p->name.size() - marker.size());
    const std::string hf_mod = hf.substr(0, hf.size() - marker.size());
    const std::string key = mlp_as_parameter(model_type, hf_mod) ? hf_mod + ".weight" : hf_mod;
    (key == hf_mod ? modules : parameters).insert(key);
    // PEFT matches pattern keys as regexes against module names; full names are literal
    // enough (dots match themselves).
    if (p->value.dim(0) != info.r) rank_pattern[key] = p->value.dim(0);
    const float al = info.alpha_of ? info.alpha_of(mod) : info.alpha;
    if (al != info.alpha) alpha_pattern[key] = al;
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
      {"target_parameters", std::vector<std::string>(parameters.begin(), parameters.end())},
      {"rank_pattern", rank_pattern},
      {"alpha_pattern", alpha_pattern}};
  const fs::path tmp = fs::path(dir) / "adapter_config.json.tmp";
  std::ofstream(tmp) << cfg.dump(2) << "\n";
  fs::rename(tmp, fs::path(dir) / "adapter_config.json");
  return out.size();
}

}  // namespace mt
