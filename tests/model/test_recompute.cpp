// Activation recompute (ModelOptions::recompute). Full: forward keeps only each layer's input,
// backward replays the layer into a one-layer scratch arena. Selective: forward keeps all but
// the FFN's saved tensors, backward replays the FFN. Gradients, loss, auxiliary losses and expert
// loads must equal the no-recompute run exactly, and the activation memory must be the kept
// tensors plus the largest replay.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "harness/batch.h"
#include "harness/seed.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "train/adamw.h"

namespace mt {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

void expect_identical_training(ModelConfig cfg, bool lora,
                               ActivationRecompute mode = ActivationRecompute::Full) {
  ModelOptions base;
  if (lora) {
    const LoraSpec spec{.rank = 2, .alpha = 4.f};
    cfg.kda.lora = cfg.mla.lora = cfg.dsa.mla.lora = cfg.moe.lora = cfg.dense.lora = spec;
    cfg.moe.expert_lora = spec;
    base.freeze_base = true;
  }
  ModelOptions rec = base;
  rec.recompute = mode;
  const uint64_t init = test::test_seed();
  Model plain(cfg, init, base), replay(cfg, init, rec);
  Rng rng(test::test_seed());
  // Break the symmetry of fresh adapters (B = 0) so that every LoRA gradient is non-trivial.
  for (const auto& p : plain.params().all())
    if (p->spec.role == ParamRole::Lora) {
      for (int64_t i = 0; i < p->value.numel(); ++i)
        p->value.f32()[i] = 0.1f * static_cast<float>(rng.normal());
      replay.params().at(p->name).value.copy_from(p->value);
    }
  Context ctx(ContextOptions{.threads = 2, .seed = 1});
  AdamW opt_a(plain.params(), AdamWOptions{}), opt_b(replay.params(), AdamWOptions{});
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(cat("step ", step));
    Batch b = test::random_batch(rng, cfg.vocab, {13, 1, 22}, 5);
    plain.params().zero_grad();
    replay.params().zero_grad();
    const double la = plain.forward(ctx, b.seq, b.ids, b.targets);
    const double lb = replay.forward(ctx, b.seq, b.ids, b.targets);
    EXPECT_EQ(la, lb);
    plain.backward(ctx);
    replay.backward(ctx);
    int64_t compared = 0;
    for (const auto& p : plain.params().all()) {
      if (!p->trainable()) continue;
      EXPECT_TRUE(same_bits(p->grad, replay.params().at(p->name).grad)) << p->name;
      ++compared;
    }
    EXPECT_GT(compared, 0);
    const auto aa = plain.aux_losses(), ab = replay.aux_losses();
    ASSERT_EQ(aa.size(), ab.size());
    // Aux values are sums over a threaded reduction whose order may differ between two runs:
    // equal to rounding, not bit for bit (their gradients above are bit-identical).
    for (size_t i = 0; i < aa.size(); ++i)
      EXPECT_NEAR(aa[i].value, ab[i].value, 1e-12 * std::abs(aa[i].value)) << aa[i].name;
    // The replay must not count its tokens again (aux-loss-free bias updates read the loads).
    const auto ma = plain.moe_layers(), mb = replay.moe_layers();
    for (size_t i = 0; i < ma.size(); ++i)
      if (ma[i]) {
        EXPECT_EQ(ma[i]->expert_load(), mb[i]->expert_load()) << "layer " << i;
      }
    EXPECT_EQ(replay.activation_bytes_used(), replay.activation_bytes(b.seq));
    opt_a.step(ctx, plain.params(), 1e-2f);
    opt_b.step(ctx, replay.params(), 1e-2f);
    for (MoeLayer* m : plain.moe_layers())
      if (m) m->update_selection_bias(ctx);
    for (MoeLayer* m : replay.moe_layers())
      if (m) m->update_selection_bias(ctx);
  }
}

TEST(Recompute, FullTrainingGradientsIdenticalToNoRecompute) {
  expect_identical_training(ModelConfig::load("tiny"), false);
}

TEST(Recompute, LoraGradientsIdenticalToNoRecompute) {
  expect_identical_training(ModelConfig::load("tiny"), true);
}

TEST(Recompute, SelectiveFullTrainingGradientsIdenticalToNoRecompute) {
  expect_identical_training(ModelConfig::load("tiny"), false, ActivationRecompute::Selective);
}

TEST(Recompute, SelectiveLoraGradientsIdenticalToNoRecompute) {
  expect_identical_training(ModelConfig::load("tiny"), true, ActivationRecompute::Selective);
}

// Selective keeps everything but the FFN internals; the scratch holds the largest FFN's saved
// tensors plus its replayed output.
TEST(Recompute, SelectiveBytesDropTheFfnsAndAddTheLargestFfn) {
  const ModelConfig cfg = ModelConfig::load("tiny");
  Model plain(cfg, 3), sel(cfg, 3, {.recompute = ActivationRecompute::Selective});
  for (const SeqInfo& seq : {SeqInfo::uniform(1, 17), SeqInfo::uniform(3, 64)}) {
    size_t ffns = 0, largest = 0;
    for (int i = 0; i < plain.num_layers(); ++i) {
      ArenaPlan p;
      plain.ffn(i).plan_activations(seq, p);
      ffns += p.bytes();
      largest = std::max(largest, p.bytes());
    }
    const size_t out = arena_footprint(static_cast<size_t>(seq.tokens * cfg.hidden) * 4);
    EXPECT_EQ(plain.activation_bytes(seq) - ffns + largest + out, sel.activation_bytes(seq));
    EXPECT_LT(sel.activation_bytes(seq), plain.activation_bytes(seq));
  }
}

TEST(Recompute, ActivationBytesAreResidualsPlusTheLargestLayer) {
  const ModelConfig cfg = ModelConfig::load("tiny");
  Model plain(cfg, 3), replay(cfg, 3, {.recompute = ActivationRecompute::Full});
  for (const SeqInfo& seq : {SeqInfo::uniform(1, 17), SeqInfo::uniform(3, 64)}) {
    const Shape act{seq.tokens, cfg.hidden}, row{seq.tokens};
    // Each layer's activations, built here from the layers' own plans.
    size_t layers = 0, largest = 0;
    for (int i = 0; i < plain.num_layers(); ++i) {
      ArenaPlan p;
      for (int k = 0; k < 4; ++k) p.add(act);
      p.add(row);
      p.add(row);
      plain.mixer(i).plan_activations(seq, p);
      plain.ffn(i).plan_activations(seq, p);
      layers += p.bytes();
      largest = std::max(largest, p.bytes());
    }
    const size_t residual = arena_footprint(static_cast<size_t>(act.numel()) * 4);
    const size_t L = static_cast<size_t>(plain.num_layers());
    EXPECT_EQ(plain.activation_bytes(seq) - layers + L * residual + largest,
              replay.activation_bytes(seq));
    EXPECT_LT(replay.activation_bytes(seq), plain.activation_bytes(seq));
  }
  // The setter switches an existing model; the next forward sizes its arenas accordingly.
  plain.set_recompute(ActivationRecompute::Full);
  EXPECT_EQ(plain.activation_bytes(SeqInfo::uniform(2, 9)),
            replay.activation_bytes(SeqInfo::uniform(2, 9)));
}

}  // namespace
}  // namespace mt
