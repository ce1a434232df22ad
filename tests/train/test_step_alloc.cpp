// A training step allocates no heap memory after warm-up: every buffer a step needs (activation
// and scratch arenas, saved layer state, loss and statistics tensors, expert loads) is planned and
// allocated by the first step. The test binary replaces the global allocation functions (operator
// new and the C allocator) with counting ones (tests/harness/alloc_hooks.h) and measures whole
// steps of the trainer's LocalExecutor (zero_grad, forward + backward, AdamW, reading the step's
// loss, norm, auxiliary losses and expert loads) on the tiny preset, full and LoRA. A negative
// control allocates inside the measured region and must be seen, so a silent hook cannot pass the
// test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "harness/alloc_hooks.h"
#include "harness/batch.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "train/adamw.h"
#include "train/trainer.h"

namespace mt {
namespace {

using test::alloc_hooks::allocations_in;

Batch make_batch(const ModelConfig& cfg, uint64_t seed,
                 const std::vector<int64_t>& lengths = {29, 3, 17}) {
  Rng rng(seed);
  return test::random_batch(rng, cfg.vocab, lengths, 5);
}

struct StepReadout {
  double loss = 0, norm = 0, aux = 0;
  int64_t load = 0;
};

void check_step_allocates_nothing(bool lora) {
  ModelConfig cfg = ModelConfig::load("tiny");
  ModelOptions mo;
  if (lora) {
    const LoraSpec spec{.rank = 2, .alpha = 4.f};
    cfg.kda.lora = cfg.mla.lora = cfg.dsa.mla.lora = cfg.moe.lora = cfg.dense.lora = spec;
    cfg.moe.expert_lora = spec;
    mo.freeze_base = true;
  }
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(cat("seed=", seed, " lora=", lora));
  Model model(cfg, seed, mo);
  AdamW opt(model.params(), AdamWOptions{.weight_decay = 0.01f, .clip_norm = 0.5});
  Context ctx(ContextOptions{.seed = seed});
  LocalExecutor exec(ctx, model, opt);
  // Two micro-batches per step (gradient accumulation) with different contents.
  const Batch a = make_batch(cfg, seed), b = make_batch(cfg, seed + 1);
  StepReadout out;
  auto step = [&] {
    exec.zero_grad();
    out.loss = exec.forward_backward(a);
    out.loss += exec.forward_backward(b);
    out.norm = exec.optimizer_step(1e-3f, 0.5);
    out.aux = 0;
    for (const AuxLoss& l : exec.aux_losses()) out.aux += l.value;
    out.load = 0;
    for (const LayerLoad& l : exec.expert_load())
      for (int64_t v : l.load) out.load += v;
  };
  step();  // warm-up: the first step plans and allocates
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(allocations_in(step), 0) << "step " << s + 2;
    EXPECT_TRUE(std::isfinite(out.loss) && out.norm > 0) << out.loss << " " << out.norm;
  }
  // Negative control inside the same measured step: a longer batch re-plans the activation arena,
  // which allocates, and the hook must see it.
  const Batch longer = make_batch(cfg, seed + 2, {61, 40});
  EXPECT_GT(allocations_in([&] {
              exec.zero_grad();
              out.loss = exec.forward_backward(longer);
              out.norm = exec.optimizer_step(1e-3f, 1.0);
            }),
            0);
  step();
  // The readouts are this step's: every MoE layer counted top_k slots per token of both batches.
  int64_t moe_layers = 0;
  for (MoeLayer* m : model.moe_layers()) moe_layers += m != nullptr;
  EXPECT_EQ(out.load, moe_layers * cfg.moe.top_k * (a.seq.tokens + b.seq.tokens));
}

TEST(StepAlloc, FullTrainingStepAllocatesNothingAfterWarmup) {
  check_step_allocates_nothing(false);
}

TEST(StepAlloc, LoraTrainingStepAllocatesNothingAfterWarmup) {
  check_step_allocates_nothing(true);
}

// Negative control: the hook sees allocations from the library's own code paths, from the
// C allocator and from other threads.
TEST(StepAlloc, HookCatchesAllocationsInsideTheMeasuredRegion) {
  EXPECT_GE(allocations_in([] { Tensor t = Tensor::empty({3, 5}); }), 1);
  EXPECT_GE(allocations_in([] {
              void* p = std::malloc(24);
              std::free(p);
            }),
            1);
  EXPECT_GE(allocations_in([] {
              std::vector<int> v(7, 1);
              EXPECT_EQ(v[6], 1);
            }),
            1);
  int64_t n = allocations_in([] {
#pragma omp parallel num_threads(2)
    {
      std::vector<double> v(5);
      v[0] = 1;
    }
  });
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace mt
