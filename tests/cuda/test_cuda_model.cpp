// The whole model on the GPU against the CPU engine: the `tiny` hybrid (KDA, gated DSA, MLA, dense
// FFN, latent MoE with a shared expert) built from the same seed on both devices, one forward and
// backward on the same packed documents, then a few AdamW steps. The CPU model is itself checked
// against the double reference and finite differences (tests/model/test_tiny_model.cpp), so here
// the CPU is the reference. Bounds come from harness/tolerance.h (the model rows). Without a GPU
// every test skips, saying so.
#include <gtest/gtest.h>

#include <cmath>

#include "core/device.h"
#include "harness/batch.h"
#include "harness/gpu_check.h"
#include "harness/images.h"
#include "harness/op_check.h"
#include "harness/tolerance.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "ops/grouped_ffn.h"
#include "ops/sparse_mqa_attention.h"
#include "train/adamw.h"

namespace mt::test {
namespace {

// The same documents with their tensors on the GPU (host offsets kept, as a staged batch has).
Batch on_gpu(const Batch& h) {
  Batch d = h;
  d.ids = h.ids.to(Device::CUDA);
  d.targets = h.targets.to(Device::CUDA);
  d.seq.cu_seqlens = h.seq.cu_seqlens.to(Device::CUDA);
  d.seq.positions = h.seq.positions.to(Device::CUDA);
  return d;
}

// Any float tensor as f32 on the host.
Tensor host_f32(const Tensor& t) {
  Tensor h = Tensor::empty(t.shape());
  h.copy_from(t.device() == Device::CPU ? t : t.to(Device::CPU));
  return h;
}

double rel(const Tensor& gpu, const Tensor& cpu) {
  const Tensor a = host_f32(gpu), b = host_f32(cpu);
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = static_cast<double>(a.f32()[i]) - b.f32()[i];
    num += d * d;
    den += static_cast<double>(b.f32()[i]) * b.f32()[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

ModelConfig hybrid_config(bool lora) {
  ModelConfig cfg = ModelConfig::load("tiny");
  cfg.layers.push_back(cfg.layers.back());
  cfg.layers.back().mixer = MixerKind::Mla;  // kda, kda, kda, dsa, mla
  if (lora) {
    const LoraSpec l{.rank = 2, .alpha = 4.f};
    cfg.kda.lora = cfg.mla.lora = cfg.dsa.mla.lora = cfg.moe.lora = cfg.dense.lora = l;
    cfg.moe.expert_lora = l;
  }
  return cfg;
}

// Non-zero adapters, so that every LoRA gradient and every base path sees them.
void break_symmetry(Model& m, uint64_t seed) {
  Rng rng(seed + 1);
  for (const auto& p : m.params().all())
    if (p->spec.role == ParamRole::Lora) {
      Tensor h = Tensor::empty(p->value.shape());
      fill_normal(rng, h, 0.1);
      p->value.copy_from(h);
    }
}

// Forward + backward on both devices; the loss, the auxiliary losses and every gradient compared.
void compare_step(const ModelConfig& cfg, const ModelOptions& opt, uint64_t seed) {
  SCOPED_TRACE(cat("seed=", seed));
  Rng rng(seed);
  const Batch docs = random_batch(rng, cfg.vocab, {37, 1, 70, 20}, 7);  // crosses a KDA chunk of 64
  Model cpu(cfg, seed, opt);
  ModelOptions gopt = opt;
  gopt.device = Device::CUDA;
  Model gpu(cfg, seed, gopt);  // built on the device directly
  break_symmetry(cpu, seed);
  break_symmetry(gpu, seed);
  Context cc(ContextOptions{.seed = seed});
  Context gc(ContextOptions{.device = Device::CUDA, .seed = seed});
  cpu.params().zero_grad();
  gpu.params().zero_grad();
  const double lc = cpu.forward(cc, docs.seq, docs.ids, docs.targets);
  const Batch gd = on_gpu(docs);
  const double lg = gpu.forward(gc, gd.seq, gd.ids, gd.targets);
  EXPECT_EQ(gpu.activation_bytes_used(), gpu.activation_bytes(docs.seq));
  cpu.backward(cc);
  gpu.backward(gc);
  gc.synchronize();
  EXPECT_NEAR(lg, lc, kModelF32Rel * std::abs(lc)) << "loss";
  const auto& ac = cpu.aux_losses();
  const auto& ag = gpu.aux_losses();
  ASSERT_EQ(ac.size(), ag.size());
  for (size_t i = 0; i < ac.size(); ++i)
    EXPECT_NEAR(ag[i].value, ac[i].value, kModelF32Rel * std::abs(ac[i].value) + 1e-9)
        << ac[i].name;
  int checked = 0;
  for (const auto& p : cpu.params().all()) {
    if (!p->trainable()) continue;
    const Param& q = gpu.params().at(p->name);
    ASSERT_TRUE(q.trainable()) << p->name;
    EXPECT_EQ(q.grad.device(), Device::CUDA) << p->name;
    EXPECT_LE(rel(q.grad, p->grad), kModelF32Rel) << p->name;
    ++checked;
  }
  EXPECT_GT(checked, 10);
  // Expert loads are integers: routing must agree exactly.
  auto mc = cpu.moe_layers(), mg = gpu.moe_layers();
  for (size_t i = 0; i < mc.size(); ++i) {
    if (!mc[i]) continue;
    EXPECT_EQ(mg[i]->expert_load(), mc[i]->expert_load()) << "layer " << i;
  }
}

TEST(CudaModel, FullTrainingStepMatchesTheCpu) {
  REQUIRE_GPU();
  compare_step(hybrid_config(false), {}, fresh_seed());
}

TEST(CudaModel, LoraStepMatchesTheCpu) {
  REQUIRE_GPU();
  compare_step(hybrid_config(true), {.freeze_base = true}, fresh_seed());
}

TEST(CudaModel, RecurrentKdaAndTiedEmbeddings) {
  REQUIRE_GPU();
  ModelConfig cfg = hybrid_config(false);
  cfg.kda.chunked = false;
  cfg.tie_embeddings = true;
  compare_step(cfg, {}, fresh_seed());
}

// A few optimizer steps: the GPU's losses track the CPU's (AdamW, clipping, bias updates and the
// staged batches all on the device).
TEST(CudaModel, AdamWStepsTrackTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  const ModelConfig cfg = hybrid_config(true);
  Model cpu(cfg, seed, {.freeze_base = true});
  Model gpu(cfg, seed, {.freeze_base = true});
  gpu.to_device(Device::CUDA);
  Context cc(ContextOptions{.seed = seed});
  Context gc(ContextOptions{.device = Device::CUDA, .seed = seed});
  AdamW oc(cpu.params(), {.clip_norm = 1.0});
  AdamW og(gpu.params(), {.clip_norm = 1.0});
  Rng rng(seed);
  for (int step = 0; step < 5; ++step) {
    const Batch d = random_batch(rng, cfg.vocab, {50, 30}, 7);
    const Batch g = on_gpu(d);
    cpu.params().zero_grad();
    gpu.params().zero_grad();
    const double lc = cpu.forward(cc, d.seq, d.ids, d.targets);
    const double lg = gpu.forward(gc, g.seq, g.ids, g.targets);
    EXPECT_NEAR(lg, lc, kModelF32Rel * std::abs(lc)) << "step " << step;
    cpu.backward(cc);
    gpu.backward(gc);
    const double nc = oc.step(cc, cpu.params(), 1e-2f);
    const double ng = og.step(gc, gpu.params(), 1e-2f);
    EXPECT_NEAR(ng, nc, kModelF32Rel * nc) << "grad norm, step " << step;
    // Selection-bias updates from the same integer loads add the same +-rate: bit-equal biases.
    // Odd steps hand the load in, as data parallelism does; even steps use the layer's count,
    // which the GPU reads where it lives.
    auto mc = cpu.moe_layers(), mg = gpu.moe_layers();
    int moe = 0;
    for (size_t i = 0; i < mc.size(); ++i) {
      if (!mc[i]) continue;
      ASSERT_EQ(mg[i]->expert_load(), mc[i]->expert_load()) << "layer " << i << ", step " << step;
      if (step % 2) {
        const std::vector<int64_t> load = mc[i]->expert_load();
        mc[i]->update_selection_bias(cc, load);
        mg[i]->update_selection_bias(gc, load);
        mc[i]->reset_expert_load();
        mg[i]->reset_expert_load();
      } else {
        mc[i]->update_selection_bias(cc);
        mg[i]->update_selection_bias(gc);
      }
      ++moe;
    }
    ASSERT_GT(moe, 0);
    int biases = 0;
    for (const auto& p : cpu.params().all())
      if (p->name.ends_with("e_score_correction_bias")) {
        const Tensor b = host_f32(gpu.params().at(p->name).value);
        for (int64_t e = 0; e < b.numel(); ++e)
          ASSERT_EQ(b.f32()[e], p->value.f32()[e]) << p->name << "[" << e << "], step " << step;
        ++biases;
      }
    EXPECT_EQ(biases, moe) << "the tiny model's MoE layers use noaux_tc selection biases";
  }
}

// bf16 weights and activations on the GPU against the CPU's fp32 model holding the same
// (bf16-rounded) weights: what remains is the rounding of activations, bounded by the model row
// of the bf16 table.
void bf16_step_check(const ModelConfig& cfg, bool kconcat) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Model gpu(cfg, seed,
            {.freeze_base = true, .precision = Precision::bf16(), .device = Device::CUDA});
  Model cpu(cfg, seed, {.freeze_base = true});
  // The routed experts' base weights live in the K-concatenation path's padded buffers exactly
  // where it runs (ops/grouped_ffn.h; Model::pad_experts).
  int experts = 0;
  for (const auto& p : gpu.params().all())
    if (p->name.ends_with("mlp.experts.gate_up_proj") ||
        p->name.ends_with("mlp.experts.down_proj")) {
      EXPECT_EQ(ops::grouped_ffn_padded(p->value, cfg.moe.expert_lora.rank), kconcat) << p->name;
      ++experts;
    }
  EXPECT_GT(experts, 0);
  break_symmetry(gpu, seed);
  for (const auto& p : cpu.params().all()) p->value.copy_from(gpu.params().at(p->name).value);
  Rng rng(seed);
  const Batch d = random_batch(rng, cfg.vocab, {37, 1, 70, 20}, 7);
  const Batch g = on_gpu(d);
  Context cc(ContextOptions{.seed = seed});
  Context gc(ContextOptions{.device = Device::CUDA, .seed = seed});
  cpu.params().zero_grad();
  gpu.params().zero_grad();
  const double lc = cpu.forward(cc, d.seq, d.ids, d.targets);
  const double lg = gpu.forward(gc, g.seq, g.ids, g.targets);
  EXPECT_EQ(gpu.activation_bytes_used(), gpu.activation_bytes(d.seq));
  cpu.backward(cc);
  gpu.backward(gc);
  EXPECT_NEAR(lg, lc, kModelBf16LossRel * std::abs(lc)) << "loss";
  // The whole gradient as one vector: a bf16 rounding may flip a near-tie of the router or the
  // indexer, which moves single parameters' gradients but not the whole by more than the bound.
  double num = 0, den = 0;
  for (const auto& p : cpu.params().all()) {
    if (!p->trainable()) continue;
    const Tensor a = host_f32(gpu.params().at(p->name).grad), b = host_f32(p->grad);
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double e = static_cast<double>(a.f32()[i]) - b.f32()[i];
      num += e * e;
      den += static_cast<double>(b.f32()[i]) * b.f32()[i];
    }
  }
  EXPECT_LE(std::sqrt(num / den), kModelBf16GradRel);
}

TEST(CudaModel, Bf16PolicyStaysWithinTheModelBound) {
  REQUIRE_GPU();
  bf16_step_check(hybrid_config(true), false);  // expert LoRA rank 2: the separate passes
}

// Expert LoRA at a rank and widths the K-concatenation path takes (rank 8, latent 16, expert
// ffn 16): the layer runs its experts K-concatenated, forward and backward, in the whole model.
TEST(CudaModel, Bf16ExpertLoraKConcatenatedStaysWithinTheModelBound) {
  REQUIRE_GPU();
  ModelConfig cfg = hybrid_config(true);
  cfg.moe.expert_ffn = 16;
  cfg.moe.expert_lora = LoraSpec{.rank = 8, .alpha = 16.f};
  bf16_step_check(cfg, true);
}

// The DSA layer's KL formed in backward (Model::Pass::Train) on the absorbed tensor-core path:
// its latent widened to DeepSeek's (kv_lora_rank 512 + rope 64: sparse_mqa_fits), so that the
// training backward's mqa_bwd_kernel writes the KL target. Against the same bf16 model run with
// Pass::Loss (the target from the prob-sum pass in forward, the old order): the KL within
// rounding and the indexer's gradients (their only input from the attention is the target,
// formed the same way) close; every gradient of both runs within the model's bf16 bound of the
// CPU's fp32 model, which runs its own prob sum in backward (Train) or forward (Loss).
TEST(CudaModel, Bf16DsaKlInBackwardMatchesKlInForward) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  ModelConfig cfg = hybrid_config(false);
  cfg.dsa.mla.kv_lora_rank = 512;
  cfg.dsa.mla.qk_rope_dim = 64;
  ASSERT_TRUE(ops::sparse_mqa_fits(cfg.dsa.mla.heads, 576, 512));
  const ModelOptions bf{.precision = Precision::bf16(), .device = Device::CUDA};
  Model loss_pass(cfg, seed, bf), train_pass(cfg, seed, bf), cpu(cfg, seed);
  for (const auto& p : loss_pass.params().all()) {
    train_pass.params().at(p->name).value.copy_from(p->value);
    cpu.params().at(p->name).value.copy_from(p->value);  // the same bf16-rounded weights
  }
  Rng rng(seed);
  const Batch d = random_batch(rng, cfg.vocab, {37, 1, 70, 20}, 7);  // past top-8: sparse
  const Batch g = on_gpu(d);
  Context cc(ContextOptions{.seed = seed});
  Context gc(ContextOptions{.device = Device::CUDA, .seed = seed});
  auto step = [&](Model& m, Context& c, const Batch& b, Model::Pass pass) {
    m.params().zero_grad();
    m.forward(c, b.seq, b.ids, b.targets, 0, pass);
    m.backward(c);
    c.synchronize();
    const std::vector<AuxLoss> aux = m.aux_losses();  // a copy: the model refills its own
    for (const AuxLoss& a : aux)
      if (a.name == "indexer_kl") return a.value;
    ADD_FAILURE() << "no indexer_kl";
    return 0.0;
  };
  const double kl_loss = step(loss_pass, gc, g, Model::Pass::Loss);
  const double kl_train = step(train_pass, gc, g, Model::Pass::Train);
  const double kl_cpu = step(cpu, cc, d, Model::Pass::Train);
  EXPECT_GT(kl_cpu, 0.0);
  EXPECT_NEAR(kl_train, kl_loss, 1e-5 * std::abs(kl_loss)) << "KL: backward's target vs forward's";
  // bf16 activations may flip a near-tie of a row's top-8 (the whole-gradient bound below
  // absorbs such flips too): a looser bound than the loss's, still far below a wrong target's.
  EXPECT_NEAR(kl_train, kl_cpu, 5e-2 * std::abs(kl_cpu)) << "KL vs the CPU";
  int indexer = 0;
  double num = 0, den = 0, num_l = 0;
  for (const auto& p : cpu.params().all()) {
    if (!p->trainable()) continue;
    const Tensor a = host_f32(train_pass.params().at(p->name).grad),
                 l = host_f32(loss_pass.params().at(p->name).grad), b = host_f32(p->grad);
    if (p->name.find(".indexer.") != std::string::npos) {
      EXPECT_LE(rel(a, l), 1e-4) << p->name << ": Train vs Loss pass";
      ++indexer;
    }
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double e = static_cast<double>(a.f32()[i]) - b.f32()[i],
                   el = static_cast<double>(l.f32()[i]) - b.f32()[i];
      num += e * e;
      num_l += el * el;
      den += static_cast<double>(b.f32()[i]) * b.f32()[i];
    }
  }
  EXPECT_GE(indexer, 5);
  EXPECT_LE(std::sqrt(num / den), kModelBf16GradRel) << "Train pass vs the CPU";
  EXPECT_LE(std::sqrt(num_l / den), kModelBf16GradRel) << "Loss pass vs the CPU";
}

// The kimi_k25 front end under the bf16 policy: the hybrid with a two-layer vision tower, whose
// blocks, final norm and projector store their activations in bf16 (statistics and the attention's
// lse in fp32) and whose pixels arrive fp32 (from the host, then already on the device: the two
// conversions round alike). Against the CPU's fp32 model holding the same bf16-rounded weights:
// the loss and the whole gradient within the model's bf16 bounds, and the tower's and projector's
// own gradients too (a small share of the whole, which could hide an error there), non-zero.
TEST(CudaModel, Bf16VisionTowerStaysWithinTheModelBound) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  const ModelConfig cfg = with_vision(hybrid_config(false));
  Model gpu(cfg, seed, {.precision = Precision::bf16(), .device = Device::CUDA});
  Model cpu(cfg, seed);
  for (const auto& p : cpu.params().all()) p->value.copy_from(gpu.params().at(p->name).value);
  Rng rng(seed);
  Batch d = random_batch(rng, cfg.vocab, {37, 1, 70, 20}, 7);
  const ImageBatch host_images = images_for(rng, cfg, d, {{2, 4}, {4, 4}}, 3);
  const ImageBatch device_images{.pixels = host_images.pixels.to(Device::CUDA),
                                 .grids = host_images.grids};
  const Batch g = on_gpu(d);
  Context cc(ContextOptions{.seed = seed});
  cpu.params().zero_grad();
  cpu.set_images(&host_images);
  const double lc = cpu.forward(cc, d.seq, d.ids, d.targets);
  cpu.backward(cc);
  double first_loss = 0;
  for (const ImageBatch* images : {&host_images, &device_images}) {
    SCOPED_TRACE(images == &host_images ? "pixels on the host" : "pixels on the device");
    // Deterministic: the two runs differ only in where the pixels were converted.
    Context gc(ContextOptions{.device = Device::CUDA, .seed = seed, .deterministic = true});
    gpu.params().zero_grad();
    gpu.set_images(images);
    const double lg = gpu.forward(gc, g.seq, g.ids, g.targets);
    gpu.backward(gc);
    gc.synchronize();
    EXPECT_NEAR(lg, lc, kModelBf16LossRel * std::abs(lc)) << "loss";
    if (images == &host_images) first_loss = lg;
    EXPECT_EQ(lg, first_loss) << "the same pixels, converted on the host and on the device";
    double num = 0, den = 0, vnum = 0, vden = 0;
    for (const auto& p : cpu.params().all()) {
      if (!p->trainable()) continue;
      const bool vision = p->name.starts_with(VisionFrontEnd::kTowerPrefix) ||
                          p->name.starts_with(VisionFrontEnd::kProjectorPrefix);
      const Tensor a = host_f32(gpu.params().at(p->name).grad), b = host_f32(p->grad);
      for (int64_t i = 0; i < a.numel(); ++i) {
        const double e = static_cast<double>(a.f32()[i]) - b.f32()[i],
                     r = static_cast<double>(b.f32()[i]) * b.f32()[i];
        num += e * e;
        den += r;
        if (vision) {
          vnum += e * e;
          vden += r;
        }
      }
    }
    EXPECT_LE(std::sqrt(num / den), kModelBf16GradRel) << "whole gradient";
    ASSERT_GT(vden, 0.0) << "the tower and projector got no gradient";
    EXPECT_LE(std::sqrt(vnum / vden), kModelBf16GradRel) << "the tower's and projector's gradient";
  }
}

}  // namespace
}  // namespace mt::test
