// The kernel registry consulted at model build time: the choice per layer for the presets and an
// HF golden config, the Model acting on it (a KDA layer whose chunked kernel is rejected runs the
// recurrence), and a violated constraint named in the fallback's warning.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "io/hf_config.h"
#include "model/model.h"
#include "plan/kernels.h"

namespace mt::plan {
namespace {

const OpKernel* find_op(const LayerKernels& k, const std::string& op) {
  for (const OpKernel& o : k.ops)
    if (o.op == op) return &o;
  return nullptr;
}

// What every layer of `cfg` must get on CPU with the default KDA settings.
void expect_cpu_choices(const ModelConfig& cfg) {
  const std::vector<LayerKernels> ks = layer_kernels(cfg, Backend::Cpu, "fp32");
  ASSERT_EQ(ks.size(), cfg.layers.size());
  for (size_t i = 0; i < ks.size(); ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    const LayerIR& l = cfg.layers[i];
    const LayerKernels& k = ks[i];
    ASSERT_NE(find_op(k, "gemm"), nullptr);
    EXPECT_EQ(find_op(k, "gemm")->kernel, "blas_sgemm");
    switch (l.mixer) {
      case MixerKind::Kda:
        ASSERT_NE(find_op(k, "kda_core"), nullptr);
        EXPECT_EQ(find_op(k, "kda_core")->kernel, "kda_chunked_cpu");
        EXPECT_FALSE(find_op(k, "kda_core")->reference);
        EXPECT_EQ(k.kda, KdaImpl::Chunked);
        EXPECT_NE(find_op(k, "conv1d"), nullptr);
        break;
      case MixerKind::Dsa:
        // The sparse stage attends over the indexer's lists; the dense warm-up attends densely.
        EXPECT_EQ(find_op(k, "indexer") != nullptr, !cfg.dsa.dense_warmup);
        if (cfg.dsa.dense_warmup) {
          ASSERT_NE(find_op(k, "mla_attention"), nullptr);
          EXPECT_EQ(find_op(k, "sparse_attention"), nullptr);
        } else {
          ASSERT_NE(find_op(k, "sparse_attention"), nullptr);
          EXPECT_EQ(find_op(k, "sparse_attention")->kernel, "index_attention_cpu");
          EXPECT_EQ(find_op(k, "mla_attention"), nullptr);
        }
        break;
      case MixerKind::Mla:
        ASSERT_NE(find_op(k, "mla_attention"), nullptr);
        EXPECT_EQ(find_op(k, "mla_attention")->kernel, "causal_attention_cpu");
        EXPECT_EQ(find_op(k, "sparse_attention"), nullptr);
        break;
    }
    const OpKernel* ex = find_op(k, "grouped_experts");
    EXPECT_EQ(ex != nullptr, l.ffn == FfnKind::Moe);
    if (ex) {
      EXPECT_EQ(ex->kernel, "grouped_ffn_cpu");
    }
    // On CPU nothing faster than these exists, so nothing warns.
    for (const OpKernel& o : k.ops) EXPECT_TRUE(o.why.empty()) << o.op << ": " << o.why;
  }
  const std::string log = describe_kernels(cfg, ks);
  EXPECT_EQ(log.find("warning"), std::string::npos) << log;
  EXPECT_NE(log.find("reference only"), std::string::npos) << log;
  // The model records what it was built with.
  if (cfg.hidden <= 512) {
    const Model m(cfg, 1, {.kernels = ks});
    ASSERT_EQ(m.kernels().size(), ks.size());
    EXPECT_EQ(m.kernels()[0].ops.size(), ks[0].ops.size());
  }
}

TEST(PlanKernels, ChoicePerLayerForPresets) {
  for (const char* name : {"tiny", "small"}) {
    SCOPED_TRACE(name);
    expect_cpu_choices(ModelConfig::load(name));
  }
}

TEST(PlanKernels, ChoicePerLayerForHfGoldenConfigs) {
  namespace fs = std::filesystem;
  fs::path root;
  if (const char* env = std::getenv("MOETRAIN_GOLDEN_DIR")) root = env;
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); root.empty() && !p.empty(); p = p.parent_path()) {
    if (fs::is_directory(p / "tests" / "golden", ec)) root = p / "tests" / "golden";
    if (p == p.parent_path()) break;
  }
  ASSERT_FALSE(root.empty()) << "tests/golden not found above " << fs::current_path(ec);
  int checked = 0;
  for (const char* name : {"kimi_a", "v32_a"}) {
    const fs::path model = root / name / "model";
    if (!fs::exists(model / "config.json")) continue;
    SCOPED_TRACE(name);
    expect_cpu_choices(load_hf_config(model.string()).model);
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// Loss of one forward over fixed tokens.
double loss_of(const ModelConfig& cfg, const ModelOptions& opt) {
  Model m(cfg, 7, opt);
  Context ctx(ContextOptions{.threads = 1, .seed = 3});
  const SeqInfo seq = SeqInfo::uniform(1, 40);
  Tensor ids = Tensor::empty({seq.tokens}, DType::I32);
  Tensor targets = Tensor::empty({seq.tokens}, DType::I32);
  for (int64_t t = 0; t < seq.tokens; ++t) {
    ids.i32()[t] = static_cast<int32_t>((t * 7 + 3) % cfg.vocab);
    targets.i32()[t] = static_cast<int32_t>((t * 5 + 1) % cfg.vocab);
  }
  return m.forward(ctx, seq, ids, targets);
}

TEST(PlanKernels, ViolatedConstraintFallsBackToReferenceWithReason) {
  ModelConfig cfg = ModelConfig::load("tiny");
  cfg.kda.chunk = 512;  // over the CPU chunked kernel's limit
  const std::vector<LayerKernels> ks = layer_kernels(cfg, Backend::Cpu, "fp32");
  int kda = 0;
  for (size_t i = 0; i < ks.size(); ++i) {
    if (cfg.layers[i].mixer != MixerKind::Kda) continue;
    ++kda;
    const OpKernel* o = find_op(ks[i], "kda_core");
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->kernel, "kda_recurrent_cpu");
    EXPECT_TRUE(o->reference);
    EXPECT_NE(o->why.find("kda_chunked_cpu: chunk 512 > 256"), std::string::npos) << o->why;
    EXPECT_EQ(ks[i].kda, KdaImpl::Recurrent);
  }
  ASSERT_GT(kda, 0);
  const std::string log = describe_kernels(cfg, ks);
  EXPECT_NE(log.find("warning: layer 0 kda_core falls back to the reference kda_recurrent_cpu "
                     "(kda_chunked_cpu: chunk 512 > 256)"),
            std::string::npos)
      << log;

  // The model acts on the choice: the same numbers as a model configured for the recurrence,
  // and the recurrence's per-token saved state in the activation plan.
  ModelConfig rec = ModelConfig::load("tiny");
  rec.kda.chunked = false;
  const double chosen = loss_of(cfg, {.kernels = ks});
  EXPECT_EQ(chosen, loss_of(rec, {}));
  const SeqInfo s = SeqInfo::uniform(1, 40);
  EXPECT_EQ(Model(cfg, 7, {.kernels = ks}).activation_bytes(s),
            Model(rec, 7, {}).activation_bytes(s));
  EXPECT_GT(Model(cfg, 7, {.kernels = ks}).activation_bytes(s),
            Model(cfg, 7, {}).activation_bytes(s));

  // Asking for the recurrence is a reason too.
  const std::vector<LayerKernels> asked = layer_kernels(rec, Backend::Cpu, "fp32");
  EXPECT_NE(find_op(asked[0], "kda_core")->why.find("config asks for the recurrence"),
            std::string::npos);
  // A CUDA plan falls back to the CPU kernels where this binary has no CUDA backend, naming the
  // missing build; a CUDA binary picks the cuBLASLt GEMM.
  const std::vector<LayerKernels> cuda =
      layer_kernels(ModelConfig::load("tiny"), Backend::Cuda, "bf16");
  if (MOETRAIN_WITH_CUDA)
    EXPECT_EQ(find_op(cuda[0], "gemm")->kernel, "cublas_bf16");
  else
    EXPECT_NE(find_op(cuda[0], "gemm")->why.find("not built"), std::string::npos);
  EXPECT_EQ(cuda[0].kda, KdaImpl::Chunked);
}

TEST(PlanKernels, ModelRejectsKernelsForWrongLayerCount) {
  const ModelConfig cfg = ModelConfig::load("tiny");
  std::vector<LayerKernels> ks = layer_kernels(cfg, Backend::Cpu, "fp32");
  ks.pop_back();
  EXPECT_THROW(Model(cfg, 1, {.kernels = ks}), ConfigError);
}

}  // namespace
}  // namespace mt::plan
