// Model::Pass::Train: a frozen LM head computes its input gradient with the loss, in one pass over
// the vocabulary (ops::lm_head_cross_entropy_forward_backward). Every gradient must equal the
// two-pass run (a Loss forward, then backward) bit for bit: on the CPU the one-pass op runs the
// same two passes, so anything else is the model's bookkeeping (the kept gradient, its loss
// weight, a head that trains). The GPU's one-pass kernel has its own check
// (CudaCrossEntropy.ForwardBackwardInOnePassEqualsTwo).
#include <gtest/gtest.h>

#include <cstring>

#include "harness/batch.h"
#include "harness/seed.h"
#include "model/model.h"

namespace mt {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

ModelConfig lora_config() {
  ModelConfig cfg = ModelConfig::load("tiny");
  const LoraSpec spec{.rank = 2, .alpha = 4.f};
  cfg.kda.lora = cfg.mla.lora = cfg.dsa.mla.lora = cfg.moe.lora = cfg.dense.lora = spec;
  return cfg;
}

// Two models from one seed; `weight_before` / `weight_after`: the CE loss weight set before the
// forward and changed after it (0: unchanged).
void expect_same_gradients(const ModelConfig& cfg, bool freeze, float weight_before,
                           float weight_after) {
  const uint64_t seed = test::test_seed();
  Model two(cfg, 11, {.freeze_base = freeze}), one(cfg, 11, {.freeze_base = freeze});
  Rng rng(seed);
  for (const auto& p : two.params().all())
    if (p->spec.role == ParamRole::Lora) {  // B = 0 would leave the adapters' gradients trivial
      for (int64_t i = 0; i < p->value.numel(); ++i)
        p->value.f32()[i] = 0.1f * static_cast<float>(rng.normal());
      one.params().at(p->name).value.copy_from(p->value);
    }
  Context ctx(ContextOptions{.threads = 2, .seed = 1});
  const Batch b = test::random_batch(rng, cfg.vocab, {13, 1, 22}, 5);
  for (Model* m : {&two, &one}) {
    m->params().zero_grad();
    m->set_loss_weight(weight_before);
  }
  const double l2 = two.forward(ctx, b.seq, b.ids, b.targets);
  const double l1 = one.forward(ctx, b.seq, b.ids, b.targets, 0, Model::Pass::Train);
  EXPECT_EQ(l1, l2) << test::seed_note();
  if (weight_after != 0.f)
    for (Model* m : {&two, &one}) m->set_loss_weight(weight_after);
  two.backward(ctx);
  one.backward(ctx);
  int64_t compared = 0;
  for (const auto& p : two.params().all()) {
    if (!p->trainable()) continue;
    EXPECT_TRUE(same_bits(p->grad, one.params().at(p->name).grad))
        << p->name << ", " << test::seed_note();
    ++compared;
  }
  EXPECT_GT(compared, 0);
}

TEST(HeadPass, TrainForwardOfAFrozenHeadGivesTheTwoPassGradients) {
  expect_same_gradients(lora_config(), true, 1.f, 0.f);
  expect_same_gradients(lora_config(), true, 0.37f, 0.f);
}

// The weight changed after the forward: backward recomputes the head's gradient for the new one.
TEST(HeadPass, ALossWeightChangedAfterTheForwardIsHonoured) {
  expect_same_gradients(lora_config(), true, 1.f, 2.5f);
}

// A head that trains takes the two-pass path (its dW needs the logits' gradient in backward).
TEST(HeadPass, ATrainedHeadKeepsTheTwoPasses) {
  expect_same_gradients(ModelConfig::load("tiny"), false, 1.f, 0.f);
}

}  // namespace
}  // namespace mt
