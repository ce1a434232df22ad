#include "train/export.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/hf_adapter.h"
#include "io/hf_names.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/job.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

void write_json(const fs::path& p, const nlohmann::json& j) {
  const fs::path tmp = p.string() + ".tmp";
  std::ofstream(tmp) << j.dump(2) << "\n";
  fs::rename(tmp, p);
}

}  // namespace

std::string export_checkpoint(const std::string& checkpoint, const std::string& format,
                              const std::string& out_dir) {
  MT_CHECK(format == "peft" || format == "hf", ValueError, "export format '", format,
           "' is not peft or hf");
  const fs::path ck = checkpoint;
  MT_CHECK(fs::is_regular_file(ck / "job.toml"), IoError, "checkpoint '", checkpoint,
           "' has no job.toml");
  std::ifstream in(ck / "job.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  const Job job = Job::parse(ss.str(), (ck / "job.toml").string());
  Model model(job_model_config(job), job.seed, job_model_options(job));
  load_checkpoint(checkpoint, model, nullptr);
  // The family decides the names: an HF model is written the way transformers and PEFT read it.
  const HfConfig hf = load_model_config(job.model);
  fs::create_directories(out_dir);

  TensorMap out;
  if (format == "peft") {
    const ModelConfig cfg = model.config();
    PeftInfo info{
        .r = job.lora_rank,
        .alpha = job.lora_alpha,
        .alpha_of =
            [&](const std::string& mod) { return lora_alpha_of(job, lora_group_of(cfg, mod)); },
        .base_model = job.model};
    MT_CHECK(std::any_of(model.params().all().begin(), model.params().all().end(),
                         [](const auto& p) { return p->spec.role == ParamRole::Lora; }),
             ValueError, "checkpoint '", checkpoint,
             "' has no LoRA adapters (a full fine-tune: use --format hf)");
    write_peft_adapter(model, hf.model_type, info, out_dir);
    for (const auto& p : model.params().all())
      if (p->spec.role == ParamRole::Lora) out["base_model.model." + p->name] = p->value;
  } else {
    // Merge: W += (alpha / r) B A for every adapted projection, and per expert for the routed
    // experts' adapters (W[e] += (alpha / r) B[e] A[e]); adapters are dropped.
    const ModelConfig cfg = model.config();
    for (const auto& p : model.params().all()) {
      if (p->spec.role == ParamRole::Lora) continue;
      const Param *a = nullptr, *b = nullptr;
      if (p->name.ends_with(".experts.gate_up_proj") || p->name.ends_with(".experts.down_proj")) {
        const std::string base = p->name.substr(0, p->name.size() - std::string("_proj").size());
        a = model.params().find(base + "_lora_A");
        b = model.params().find(base + "_lora_B");
      } else if (p->name.ends_with(".weight")) {
        const std::string base = p->name.substr(0, p->name.size() - std::string(".weight").size());
        a = model.params().find(base + ".lora_A.weight");
        b = model.params().find(base + ".lora_B.weight");
      }
      Tensor w = p->value.clone();
      if (a && b) {
        // Expert tensors carry a leading expert dimension; a plain projection is one "expert".
        const bool experts = w.ndim() == 3;
        const int64_t E = experts ? w.dim(0) : 1, n_out = w.dim(-2), n_in = w.dim(-1);
        const int64_t rk = a->value.dim(-2);
        const float s = lora_alpha_of(job, lora_group_of(cfg, p->name)) / static_cast<float>(rk);
        for (int64_t e = 0; e < E; ++e) {
          const float* A = a->value.f32() + e * rk * n_in;
          const float* B = b->value.f32() + e * n_out * rk;
          float* W = w.f32() + e * n_out * n_in;
          for (int64_t o = 0; o < n_out; ++o)
            for (int64_t k = 0; k < rk; ++k) {
              const float bk = s * B[o * rk + k];
              for (int64_t i = 0; i < n_in; ++i) W[o * n_in + i] += bk * A[k * n_in + i];
            }
        }
      }
      out[p->name] = w;
    }
    if (hf.model_type == "moetrain_hybrid") {
      write_safetensors((fs::path(out_dir) / "model.safetensors").string(), out);
      write_json(fs::path(out_dir) / "config.json", cfg.to_json());
    } else {
      // The merged weights in the family's checkpoint layout with its own config.json.
      for (const auto& [name, w] : out) model.params().at(name).value.copy_from(w);
      save_hf_model(model, hf, out_dir);
    }
  }
  size_t bytes = 0;
  for (const auto& [n, t] : out) bytes += t.bytes();
  return cat(format, " export: ", out.size(), " tensors, ", bytes, " bytes in ", out_dir);
}

std::string export_model_dir(const std::string& dir, const std::string& format,
                             const std::string& out_dir, const ProgressFn& progress) {
  MT_CHECK(format == "hf", ValueError, "export --model: format '", format,
           "' needs a trained checkpoint (--checkpoint); a model directory exports as hf");
  MT_CHECK(has_weights(dir), IoError, "model directory '", dir, "' has no safetensors weights");
  LoadedModel lm = load_hf_model(dir, {}, progress);
  save_hf_model(*lm.model, lm.config, out_dir);
  return cat("hf export: ", lm.config.model_type, " from ", dir, " (dequantised, f32) in ",
             out_dir);
}

}  // namespace mt
