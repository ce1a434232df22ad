#include "train/adapter.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

const std::string kPrefix = "base_model.model.";

struct GroupSpec {
  LoraGroup spec;
  std::string module;  // the first module seen, named when another one disagrees
};

void add_module(std::map<std::string, GroupSpec>& groups, const std::string& group,
                const std::string& module, int64_t rank, float alpha, const std::string& dir) {
  auto [it, fresh] = groups.try_emplace(group, GroupSpec{{rank, alpha}, module});
  if (fresh) return;
  const LoraGroup& g = it->second.spec;
  MT_CHECK(g.rank == rank, ConfigError, "adapter '", dir, "': rank mismatch in LoRA group '", group,
           "': module '", module, "' has rank ", rank, ", module '", it->second.module, "' rank ",
           g.rank, " (one rank per group)");
  MT_CHECK(g.alpha == alpha, ConfigError, "adapter '", dir, "': alpha mismatch in LoRA group '",
           group, "': module '", module, "' has lora_alpha ", alpha, ", module '",
           it->second.module, "' ", g.alpha, " (one alpha per group)");
}

// lora_group_of indexes the config's layer list: a module of a deeper model must be an error
// naming it, not an out-of-range exception.
std::string group_of(const ModelConfig& cfg, const std::string& module, const std::string& dir) {
  try {
    const std::string g = lora_group_of(cfg, module);
    if (!g.empty() && g != "router") return g;
  } catch (const std::exception&) {
  }
  MT_THROW(ConfigError, "adapter '", dir, "' targets module '", module,
           "', which the base model has no LoRA group for (an adapter of another base model?)");
}

// The base's own config (not the job's preset, which a caller's base need not match) with one
// group's adapters; the group names are job_model_config's.
void set_group(ModelConfig& c, const std::string& group, const LoraGroup& g) {
  const LoraSpec spec{.rank = g.rank, .alpha = g.alpha};
  if (group == "attention") {
    c.mla.lora = c.dsa.mla.lora = spec;
  } else if (group == "kda") {
    c.kda.lora = spec;
  } else if (group == "shared_experts") {
    c.moe.lora = spec;
  } else if (group == "routed_experts") {
    c.moe.expert_lora = spec;
  } else if (group == "dense_ffn") {
    c.dense.lora = spec;
  }
}

}  // namespace

std::unique_ptr<Model> apply_peft_adapter(const Model& base, const Job& base_job,
                                          const std::string& dir) {
  const fs::path d = dir;
  MT_CHECK(fs::is_regular_file(d / "adapter_config.json"), IoError, "adapter '", dir,
           "' has no adapter_config.json (expected a directory from moetrain export --format "
           "peft)");
  MT_CHECK(fs::is_regular_file(d / "adapter_model.safetensors"), IoError, "adapter '", dir,
           "' has no adapter_model.safetensors");
  for (const auto& p : base.params().all())
    MT_CHECK(p->spec.role != ParamRole::Lora, ConfigError,
             "the base model already carries LoRA adapters ('", p->name,
             "'); give the checkpoint the adapter was trained on");
  nlohmann::json cfg;
  try {
    std::ifstream in(d / "adapter_config.json");
    cfg = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MT_THROW(ConfigError, "adapter '", dir, "': adapter_config.json is not JSON (", e.what(), ")");
  }
  auto key = [&](const char* k) -> const nlohmann::json& {
    MT_CHECK(cfg.contains(k), ConfigError, "adapter '", dir, "': adapter_config.json lacks '", k,
             "'");
    return cfg.at(k);
  };
  MT_CHECK(key("peft_type") == "LORA", ConfigError, "adapter '", dir, "': peft_type ",
           key("peft_type").dump(), " is not \"LORA\"");
  const std::string trained_on = cfg.value("base_model_name_or_path", std::string());
  MT_CHECK(trained_on.empty() || trained_on == base_job.model, ConfigError, "adapter '", dir,
           "' was trained on base model '", trained_on, "', not '", base_job.model,
           "' (base_model_name_or_path)");
  MT_CHECK(key("r").is_number_integer() && key("lora_alpha").is_number(), ConfigError, "adapter '",
           dir, "': r must be an integer and lora_alpha a number");
  const auto r = key("r").get<int64_t>();
  const auto alpha = key("lora_alpha").get<float>();
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& rank_pattern = cfg.contains("rank_pattern") ? cfg["rank_pattern"] : empty;
  const nlohmann::json& alpha_pattern =
      cfg.contains("alpha_pattern") ? cfg["alpha_pattern"] : empty;
  auto rank_of = [&](const std::string& m) {
    return rank_pattern.contains(m) ? rank_pattern[m].get<int64_t>() : r;
  };
  auto alpha_of = [&](const std::string& m) {
    return alpha_pattern.contains(m) ? alpha_pattern[m].get<float>() : alpha;
  };

  TensorMap tensors;
  for (auto& [k, t] : read_safetensors((d / "adapter_model.safetensors").string()).tensors) {
    MT_CHECK(k.rfind(kPrefix, 0) == 0, ConfigError, "adapter '", dir, "': tensor '", k,
             "' is not under '", kPrefix, "'");
    tensors.emplace(k.substr(kPrefix.size()), t);
  }

  const ModelConfig& bc = base.config();
  std::map<std::string, GroupSpec> groups;
  for (const auto& m : key("target_modules")) {
    const std::string mod = m.get<std::string>();
    MT_CHECK(base.params().find(mod + ".weight") != nullptr, ConfigError, "adapter '", dir,
             "' targets module '", mod, "', which the base model lacks (another base model?)");
    const std::string a = mod + ".lora_A.weight";
    MT_CHECK(tensors.count(a), ConfigError, "adapter '", dir, "' lacks tensor '", kPrefix + a,
             "' of target module '", mod, "'");
    const Tensor& ta = tensors.at(a);
    MT_CHECK(ta.ndim() == 2 && ta.dim(0) == rank_of(mod), ConfigError, "adapter '", dir,
             "': rank mismatch: tensor '", kPrefix + a, "' has shape ", ta.shape(),
             " but adapter_config.json gives module '", mod, "' rank ", rank_of(mod));
    add_module(groups, group_of(bc, mod, dir), mod, rank_of(mod), alpha_of(mod), dir);
  }
  // Routed experts are not PEFT modules (target_modules omits them): the rank is the tensors'
  // and the alpha comes from alpha_pattern under the experts' module name.
  const std::string ge = ".mlp.experts.gate_up_lora_A";
  for (const auto& [k, t] : tensors) {
    if (!k.ends_with(ge)) continue;
    const std::string mod = k.substr(0, k.size() - ge.size()) + ".mlp.experts";
    MT_CHECK(t.ndim() == 3, ConfigError, "adapter '", dir, "': tensor '", kPrefix + k,
             "' has shape ", t.shape(), ", expected [experts, rank, in]");
    add_module(groups, group_of(bc, k, dir), mod, t.dim(1), alpha_of(mod), dir);
  }
  MT_CHECK(!groups.empty(), ConfigError, "adapter '", dir, "' adapts no module");

  ModelConfig adapted = bc;
  for (const auto& [g, s] : groups) set_group(adapted, g, s.spec);
  auto out = std::make_unique<Model>(adapted, base_job.seed, ModelOptions{});
  std::set<std::string> used;
  for (const auto& p : out->params().all()) {
    if (p->spec.role != ParamRole::Lora) {
      p->value.copy_from(base.params().find(p->name)->value);
      continue;
    }
    auto it = tensors.find(p->name);
    MT_CHECK(it != tensors.end(), ConfigError, "adapter '", dir, "' lacks tensor '",
             kPrefix + p->name, "' (shape ", p->value.shape(), ")");
    MT_CHECK(it->second.shape() == p->value.shape(), ConfigError, "adapter '", dir, "': tensor '",
             kPrefix + p->name, "' has shape ", it->second.shape(), ", the base model expects ",
             p->value.shape());
    p->value.copy_from(it->second);
    used.insert(p->name);
  }
  for (const auto& [k, t] : tensors)
    MT_CHECK(used.count(k), ConfigError, "adapter '", dir, "': tensor '", kPrefix + k, "' (shape ",
             t.shape(), ") matches no adapter of the base model");
  return out;
}

}  // namespace mt
