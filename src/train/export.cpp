#include "train/export.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/hf_adapter.h"
#include "io/hf_names.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/checkpoint_reader.h"
#include "train/job.h"

namespace mt {

namespace fs = std::filesystem;

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
  // Streamed: the base weights are placeholders (no memory) and each is read from the checkpoint,
  // merged and written in turn, so an export holds one tensor at a time beside the adapters, of a
  // one-process or a sharded checkpoint alike.
  ModelOptions mopt = job_model_options(job);
  mopt.defer_weights = true;
  Model model(job_model_config(job), job.seed, mopt);
  const ModelConfig cfg = model.config();
  const CheckpointReader reader(checkpoint, cfg);
  // A parameter's trained value: the fp32 master where the checkpoint kept one (a narrower
  // policy stores the weight rounded).
  const auto value_of = [&](const Param& p) {
    Tensor t = Tensor::empty(p.spec.shape);
    const std::string master = "master." + p.name;
    reader.read(reader.contains(master) ? master : p.name, 0, t.numel(), t.f32());
    return t;
  };
  // The family decides the names: an HF model is written the way transformers and PEFT read it.
  const HfConfig hf = load_model_config(job.model);
  fs::create_directories(out_dir);

  size_t tensors = 0, bytes = 0;
  if (format == "peft") {
    PeftInfo info{
        .r = job.lora_rank,
        .alpha = job.lora_alpha,
        .alpha_of =
            [&](const std::string& mod) { return lora_alpha_of(job, lora_group_of(cfg, mod)); },
        .base_model = job.model};
    for (const auto& p : model.params().all()) {
      if (p->spec.role != ParamRole::Lora) continue;
      p->value.copy_from(value_of(*p));
      ++tensors;
      bytes += p->value.bytes();
    }
    MT_CHECK(tensors > 0, ValueError, "checkpoint '", checkpoint,
             "' has no LoRA adapters (a full fine-tune: use --format hf)");
    write_peft_adapter(model, hf.model_type, info, out_dir);
  } else {
    // Merge: W += (alpha / r) B A for every adapted projection, and per expert for the routed
    // experts' adapters (W[e] += (alpha / r) B[e] A[e]); adapters are dropped.
    const ParamValues merged = [&](const Param& p) {
      Tensor w = value_of(p);
      const Param *a = nullptr, *b = nullptr;
      if (p.name.ends_with(".experts.gate_up_proj") || p.name.ends_with(".experts.down_proj")) {
        const std::string base = p.name.substr(0, p.name.size() - std::string("_proj").size());
        a = model.params().find(base + "_lora_A");
        b = model.params().find(base + "_lora_B");
      } else if (p.name.ends_with(".weight")) {
        const std::string base = p.name.substr(0, p.name.size() - std::string(".weight").size());
        a = model.params().find(base + ".lora_A.weight");
        b = model.params().find(base + ".lora_B.weight");
      }
      if (!a || !b) return w;
      const Tensor av = value_of(*a), bv = value_of(*b);
      // Expert tensors carry a leading expert dimension; a plain projection is one "expert".
      const bool experts = w.ndim() == 3;
      const int64_t E = experts ? w.dim(0) : 1, n_out = w.dim(-2), n_in = w.dim(-1);
      const int64_t rk = av.dim(-2);
      const float s = lora_alpha_of(job, lora_group_of(cfg, p.name)) / static_cast<float>(rk);
      for (int64_t e = 0; e < E; ++e) {
        const float* A = av.f32() + e * rk * n_in;
        const float* B = bv.f32() + e * n_out * rk;
        float* W = w.f32() + e * n_out * n_in;
        for (int64_t o = 0; o < n_out; ++o)
          for (int64_t k = 0; k < rk; ++k) {
            const float bk = s * B[o * rk + k];
            for (int64_t i = 0; i < n_in; ++i) W[o * n_in + i] += bk * A[k * n_in + i];
          }
      }
      return w;
    };
    for (const auto& p : model.params().all()) {
      if (p->spec.role == ParamRole::Lora) continue;
      ++tensors;
      bytes += static_cast<size_t>(p->spec.shape.numel()) * sizeof(float);
    }
    // The hybrid's config is the job's (what `train --model` reads back); an HF family is written
    // in its checkpoint layout with its own config.json.
    save_hf_model(model, hf.model_type == "moetrain_hybrid" ? hybrid_hf_config(cfg) : hf, out_dir,
                  uint64_t{5} << 30, merged);
  }
  return cat(format, " export: ", tensors, " tensors, ", bytes, " bytes in ", out_dir);
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
