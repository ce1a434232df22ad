// `export` of a checkpoint at model size holds one tensor at a time (train/export.h), run by ctest
// (tests/CMakeLists.txt). A one-process LoRA checkpoint of a multi-layer deepseek_v3 model (about
// 180 MB of f32 weights, nearly all routed experts; adapters on attention, shared and routed
// experts, B random so that every merge changes its weight) is written into --dir; then, measured:
//   memory  the peak resident growth (VmHWM, reset by clear_refs 5, minus VmRSS then: the
//           kernel's count, file pages of the memory-mapped checkpoint included) of
//           export_checkpoint --format hf, then --format peft, each below --max-fraction of the
//           model's bytes. What is legitimately held at once: one parameter read from the
//           checkpoint and merged (the largest is a layer's fused gate_up experts, 1/7 * 2/3 of
//           the model here), its per-expert split for the HF layout (as much again), the
//           adapters and a 1 MiB checksum block: about 20%, against at least 100% for any export
//           that builds or reads the whole model;
//   values  the exported directory, loaded back (load_hf_model), equals W + (alpha / r) B A
//           computed in double from the checkpoint's own tensors, for every parameter, to 1e-5
//           of each tensor's largest value; the PEFT adapter's tensors equal the checkpoint's
//           adapters (write_peft_adapter's layout is checked against PEFT in tools/check_peft.py).
// --whole: the negative control, the export done as before (the whole model loaded, then
// written): the memory bound must fail. Exit status 0 only when every check passes.
#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "../parallel/mpi_check.h"
#include "io/hf_adapter.h"
#include "io/hf_names.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/job.h"

namespace {

namespace fs = std::filesystem;
using mt::ValueError;

struct Args {
  std::string dir;
  double max_fraction = 1.0;
  bool whole = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--whole") {
      a.whole = true;
      continue;
    }
    MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
    const char* v = argv[++i];
    if (k == "--dir")
      a.dir = v;
    else if (k == "--max-fraction")
      a.max_fraction = std::atof(v);
    else
      MT_THROW(ValueError, "unknown argument ", k);
  }
  MT_CHECK(!a.dir.empty(), ValueError, "--dir is required");
  return a;
}

const char* kConfig = R"({
  "model_type": "deepseek_v3", "vocab_size": 4096, "hidden_size": 256,
  "intermediate_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 8,
  "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 16, "num_experts_per_tok": 2, "n_shared_experts": 1,
  "n_routed_experts": 32, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1
})";

// Peak resident growth of fn(), in bytes, with freed memory handed back first.
template <typename Fn>
int64_t peak_growth(Fn&& fn) {
  malloc_trim(0);
  mt::test::reset_peak_rss();
  const int64_t baseline = mt::test::status_bytes("VmRSS");
  fn();
  return mt::test::status_bytes("VmHWM") - baseline;
}

int run(const Args& a) {
  using namespace mt;
  fs::remove_all(a.dir);
  const fs::path root = a.dir, model_dir = root / "model";
  fs::create_directories(model_dir);
  std::ofstream(model_dir / "config.json") << kConfig;
  Job job;
  job.model = model_dir.string();
  job.lora_targets = {"attention", "shared_experts", "routed_experts"};
  job.lora_rank = 2;
  job.lora_alpha = 6;
  job.seed = 5;
  job.train_data = (root / "data").string();  // a job names one; export reads none
  const ModelConfig cfg = job_model_config(job);
  int64_t model_bytes = 0;
  for (const NamedSpec& s : model_param_specs(cfg))
    if (s.spec.role != ParamRole::Lora) model_bytes += s.spec.shape.numel() * 4;
  std::string ck;
  {
    Model m(cfg, job.seed, job_model_options(job));
    randomize_lora(m, 17);
    ck = save_checkpoint((root / "ck").string(), m, nullptr, {.step = 1}, job.to_toml());
  }
  int failures = 0;
  const auto bound = [&](const char* what, int64_t peak) {
    const double f = static_cast<double>(peak) / static_cast<double>(model_bytes);
    std::printf("%s: model %.1f MB, peak growth %.1f MB = %.1f%% of the model (limit %.0f%%)\n",
                what, model_bytes / 1e6, peak / 1e6, 100 * f, 100 * a.max_fraction);
    if (f >= a.max_fraction) {
      std::printf("FAIL peak growth of %s %.1f%% of the model, limit %.0f%%\n", what, 100 * f,
                  100 * a.max_fraction);
      ++failures;
    }
  };
  const std::string hf_out = (root / "hf").string(), peft_out = (root / "peft").string();
  if (a.whole) {
    bound("whole-model export", peak_growth([&] {
            Model m(cfg, job.seed, job_model_options(job));
            load_checkpoint(ck, m, nullptr);
            save_hf_model(m, load_hf_config(model_dir.string()), hf_out);
          }));
    return failures ? 1 : 0;
  }
  bound("export --format hf", peak_growth([&] { export_checkpoint(ck, "hf", hf_out); }));
  bound("export --format peft", peak_growth([&] { export_checkpoint(ck, "peft", peft_out); }));

  // Values against a double-precision merge of the checkpoint's own tensors.
  const SafetensorsData saved = read_safetensors((fs::path(ck) / "model.safetensors").string());
  const LoadedModel back = load_hf_model(hf_out);
  const auto tensor = [&](const std::string& n) -> const Tensor* {
    auto it = saved.tensors.find(n);
    return it == saved.tensors.end() ? nullptr : &it->second;
  };
  int merged = 0, compared = 0;
  double worst = 0;
  for (const auto& p : back.model->params().all()) {
    const Tensor* w = tensor(p->name);
    MT_CHECK(w, ValueError, "checkpoint lacks ", p->name);
    std::string base = p->name, a_name, b_name;
    if (base.ends_with(".experts.gate_up_proj") || base.ends_with(".experts.down_proj")) {
      base.resize(base.size() - 5);
      a_name = base + "_lora_A";
      b_name = base + "_lora_B";
    } else if (base.ends_with(".weight")) {
      base.resize(base.size() - 7);
      a_name = base + ".lora_A.weight";
      b_name = base + ".lora_B.weight";
    }
    const Tensor *A = tensor(a_name), *B = tensor(b_name);
    const int64_t n = w->numel();
    std::vector<double> want(w->f32(), w->f32() + n);
    if (A && B) {
      ++merged;
      const bool experts = w->ndim() == 3;
      const int64_t E = experts ? w->dim(0) : 1, O = w->dim(-2), I = w->dim(-1);
      const int64_t r = A->dim(-2);
      const double s = job.lora_alpha / static_cast<double>(r);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t o = 0; o < O; ++o)
          for (int64_t i = 0; i < I; ++i) {
            double d = 0;
            for (int64_t k = 0; k < r; ++k)
              d += static_cast<double>(B->f32()[(e * O + o) * r + k]) *
                   A->f32()[(e * r + k) * I + i];
            want[static_cast<size_t>((e * O + o) * I + i)] += s * d;
          }
    }
    double scale = 0, err = 0;
    for (int64_t i = 0; i < n; ++i) {
      scale = std::max(scale, std::fabs(want[static_cast<size_t>(i)]));
      err = std::max(err, std::fabs(p->value.f32()[i] - want[static_cast<size_t>(i)]));
    }
    worst = std::max(worst, err / scale);
    if (err > 1e-5 * scale) {
      std::printf("FAIL %s: exported differs from the double merge by %.3g (largest %.3g)\n",
                  p->name.c_str(), err, scale);
      ++failures;
    }
    ++compared;
  }
  if (merged == 0) {
    std::printf("FAIL no parameter had an adapter to merge\n");
    ++failures;
  }
  std::printf("hf export: %d tensors (%d merged) equal the double merge, worst %.3g of largest\n",
              compared, merged, worst);
  // Adapters of plain projections keep their engine names and layout in PEFT's file (the routed
  // experts' are re-laid out for PEFT's ParamWrapper: tools/check_peft.py checks those).
  const SafetensorsData adapter = read_safetensors_model(peft_out);
  int same = 0;
  for (const auto& [name, t] : saved.tensors) {
    if (!name.ends_with(".lora_A.weight") && !name.ends_with(".lora_B.weight")) continue;
    auto it = adapter.tensors.find("base_model.model." + name);
    if (it == adapter.tensors.end() || it->second.shape() != t.shape() ||
        std::memcmp(it->second.raw(), t.raw(), t.bytes()) != 0) {
      std::printf("FAIL %s: missing from the PEFT adapter or different\n", name.c_str());
      ++failures;
      continue;
    }
    ++same;
  }
  if (same == 0) {
    std::printf("FAIL no projection adapter in the PEFT export\n");
    ++failures;
  }
  std::printf(
      "peft export: %d projection adapters equal the checkpoint's bit for bit (%zu tensors)\n",
      same, adapter.tensors.size());
  fs::remove_all(a.dir);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::printf("FAIL %s\n", e.what());
    return 1;
  }
}
