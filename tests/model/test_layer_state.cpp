// Caller-owned layer state (Layer::make_state, Model micro-batch slots): two micro-batches
// forwarded through the same model before either backward must give exactly the gradients and
// losses of running them one after the other, for a model with every layer kind (KDA, DSA, MLA,
// dense FFN, latent MoE). When layers kept their saved tensors as members, the second forward
// overwrote the first's (and the model reset its one activation arena), so the first backward
// read the second micro-batch's activations: with the two batches' token counts differing here,
// it would have thrown a shape error or produced the second batch's gradients.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/batch.h"
#include "harness/grad_bits.h"
#include "harness/images.h"
#include "harness/model_configs.h"
#include "harness/seed.h"
#include "model/dense_ffn.h"
#include "model/kda_layer.h"
#include "model/model.h"
#include "model/vision/vision_front.h"

namespace mt {
namespace {

using Grads = test::GradBits;
using test::grad_bits;

void expect_same_bits(const Grads& want, const Grads& got, const char* what) {
  SCOPED_TRACE(test::seed_note());
  ASSERT_EQ(want.size(), got.size()) << what;
  ASSERT_GT(want.size(), 0u) << what;
  for (const auto& [name, bytes] : want)
    EXPECT_TRUE(got.at(name) == bytes) << what << ": gradient of " << name << " differs";
}

void expect_interleaved_equals_sequential(ActivationRecompute recompute, bool lora, bool lifo,
                                          bool images = false) {
  const ModelConfig text = test::every_layer_kind(lora);
  const ModelConfig cfg = images ? test::with_vision(text) : text;
  ModelOptions opt{.freeze_base = lora, .recompute = recompute};
  Model seq_model(cfg, 21, opt), mixed(cfg, 21, opt);
  Rng rng(test::test_seed());
  if (lora)  // fresh adapters have B = 0: make every LoRA gradient non-trivial
    for (const auto& p : seq_model.params().all())
      if (p->spec.role == ParamRole::Lora) {
        for (int64_t i = 0; i < p->value.numel(); ++i)
          p->value.f32()[i] = 0.1f * static_cast<float>(rng.normal());
        mixed.params().at(p->name).value.copy_from(p->value);
      }
  // A is the longer batch, so that B's forward re-sizes the shared recompute scratch below
  // what A's backward needs.
  Batch a = test::random_batch(rng, cfg.vocab, {19, 1, 30}, 3);
  Batch b = test::random_batch(rng, cfg.vocab, {7, 12}, 2);
  // With a tower, A's images are more and larger than B's (so B's would not fit A's state).
  ImageBatch ia, ib;
  if (images) {
    ia = test::images_for(rng, cfg, a, {{2, 4}, {4, 4}, {2, 2}}, 3);
    ib = test::images_for(rng, cfg, b, {{2, 2}}, 9);
  }
  Context ctx(ContextOptions{.threads = 2, .seed = 1});
  auto forward = [&](Model& m, const Batch& x, const ImageBatch& im, int slot) {
    m.set_images(images ? &im : nullptr);
    return m.forward(ctx, x.seq, x.ids, x.targets, slot);
  };

  // One after the other, each gradient from zero.
  seq_model.params().zero_grad();
  const double la = forward(seq_model, a, ia, 0);
  seq_model.backward(ctx);
  const Grads ga = grad_bits(seq_model);
  if (images)  // the tower and projector must get gradients, or comparing them proves nothing
    for (const char* part : {VisionFrontEnd::kTowerPrefix, VisionFrontEnd::kProjectorPrefix}) {
      bool nonzero = false;
      for (const auto& [name, bytes] : ga)
        if (name.rfind(part, 0) == 0)
          for (char c : bytes) nonzero |= c != 0;
      EXPECT_TRUE(nonzero) << "no gradient under " << part;
    }
  seq_model.params().zero_grad();
  const double lb = forward(seq_model, b, ib, 0);
  seq_model.backward(ctx);
  const Grads gb = grad_bits(seq_model);

  // Both forwards in flight, then the backwards (last in first out, or first in first out).
  mixed.params().zero_grad();
  EXPECT_EQ(forward(mixed, a, ia, /*slot=*/0), la);
  EXPECT_EQ(forward(mixed, b, ib, /*slot=*/1), lb);
  const int first = lifo ? 1 : 0;
  mixed.backward(ctx, first);
  expect_same_bits(first == 1 ? gb : ga, grad_bits(mixed), "first backward");
  mixed.params().zero_grad();
  mixed.backward(ctx, 1 - first);
  expect_same_bits(first == 1 ? ga : gb, grad_bits(mixed), "second backward");
}

TEST(LayerState, TwoMicroBatchesInFlightLifoMatchSequential) {
  expect_interleaved_equals_sequential(ActivationRecompute::None, false, true);
}

TEST(LayerState, TwoMicroBatchesInFlightFifoMatchSequential) {
  expect_interleaved_equals_sequential(ActivationRecompute::None, false, false);
}

TEST(LayerState, TwoMicroBatchesInFlightLoraMatchSequential) {
  expect_interleaved_equals_sequential(ActivationRecompute::None, true, true);
}

TEST(LayerState, TwoMicroBatchesInFlightSelectiveRecomputeMatchSequential) {
  expect_interleaved_equals_sequential(ActivationRecompute::Selective, false, false);
}

TEST(LayerState, TwoMicroBatchesInFlightFullRecomputeMatchSequential) {
  expect_interleaved_equals_sequential(ActivationRecompute::Full, false, true);
}

// The vision tower's state is the slot's too: A's images differ from B's in count and size.
TEST(LayerState, TwoImageBatchesInFlightMatchSequential) {
  expect_interleaved_equals_sequential(ActivationRecompute::None, false, true, /*images=*/true);
}

TEST(LayerState, TwoImageBatchesInFlightFifoSelectiveRecomputeMatchSequential) {
  expect_interleaved_equals_sequential(ActivationRecompute::Selective, false, false, true);
}

TEST(LayerState, BackwardOfASlotWithoutItsForwardIsAnError) {
  Model m(test::every_layer_kind(false), 3);
  Rng rng(test::test_seed());
  const Batch a = test::random_batch(rng, m.config().vocab, {9}, 1);
  Context ctx;
  m.forward(ctx, a.seq, a.ids, a.targets, /*slot=*/0);
  EXPECT_THROW(m.backward(ctx, /*slot=*/1), InternalError);
  EXPECT_THROW(m.forward(ctx, a.seq, a.ids, a.targets, /*slot=*/-1), ValueError);
  m.backward(ctx, 0);
  EXPECT_THROW(m.backward(ctx, 0), InternalError);  // a forward is consumed by its backward
}

TEST(LayerState, AStateOfAnotherLayerKindIsRefused) {
  const ModelConfig cfg = ModelConfig::load("tiny");
  KdaLayer kda(cfg.kda);
  DenseFfn ffn(cfg.dense);
  const std::unique_ptr<LayerState> wrong = ffn.make_state();
  const SeqInfo seq = SeqInfo::uniform(1, 4);
  Tensor x = Tensor::zeros({4, cfg.hidden}), y = Tensor::zeros({4, cfg.hidden});
  Arena acts;
  Context ctx;
  EXPECT_THROW(kda.forward(ctx, seq, x, y, acts, *wrong), ValueError);
}

}  // namespace
}  // namespace mt
