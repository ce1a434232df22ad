// Training with the overflow policy on converges like training without it (issue 7: the loss with
// balancing on stays within 2% of off on the same data).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/rng.h"
#include "harness/seed.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "train/adamw.h"

namespace mt {
namespace {

struct Batch {
  SeqInfo seq;
  Tensor ids, targets;
};

// Half learnable (next = 5 * token + step mod V), half noise: the loss falls from ln V towards a
// floor of about half of it, like a language model's, so a 2% band is a meaningful tolerance.
Batch make_batch(Rng& rng, int64_t vocab, int64_t docs, int64_t len) {
  Batch b;
  b.seq = SeqInfo::from_lengths(std::vector<int64_t>(static_cast<size_t>(docs), len));
  b.ids = Tensor::empty({b.seq.tokens}, DType::I32);
  b.targets = Tensor::empty({b.seq.tokens}, DType::I32);
  for (int64_t d = 0; d < docs; ++d) {
    int64_t tok = rng.below(vocab);
    const int64_t step = 1 + rng.below(3);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t next = rng.uniform() < 0.5 ? (tok * 5 + step) % vocab : rng.below(vocab);
      b.ids.i32()[d * len + i] = static_cast<int32_t>(tok);
      b.targets.i32()[d * len + i] = static_cast<int32_t>(next);
      tok = next;
    }
  }
  return b;
}

struct Result {
  double initial_loss = 0;  // the held-out loss of the initial weights
  double final_loss = 0;
  double rerouted = 0;
};

// The runs a test compares share `seed`: the same initial weights, training and held-out data.
Result train(bool balance, int steps, uint64_t seed) {
  ModelConfig cfg = ModelConfig::load("tiny");
  cfg.moe.num_experts = 12;
  cfg.moe.n_group = 1;
  cfg.moe.topk_group = 1;
  Model model(cfg, seed);
  Context ctx(ContextOptions{.seed = 3});
  Rng data = Rng(seed).fork(1), held = Rng(seed).fork(2);
  std::vector<Batch> eval;
  for (int i = 0; i < 4; ++i) eval.push_back(make_batch(held, cfg.vocab, 4, 24));
  Result r;
  {
    // A copy of the initial weights: a forward counts expert loads into the selection bias.
    Model start(cfg, seed);
    for (const Batch& b : eval) r.initial_loss += start.forward(ctx, b.seq, b.ids, b.targets) / 4;
  }
  if (balance)
    for (MoeLayer* m : model.moe_layers())
      if (m)
        m->set_overflow_policy({.extra = 3,
                                .expert_capacity = 1.25f,
                                .rank_capacity = 1.1f,
                                .max_reroute_share = 0.05f},
                               ops::contiguous_expert_ranks(12, 4));
  AdamW opt(model.params(), AdamWOptions{});
  int64_t moved = 0, pairs = 0;
  for (int s = 0; s < steps; ++s) {
    const Batch b = make_batch(data, cfg.vocab, 4, 24);  // fresh data: the noise cannot be learnt
    model.params().zero_grad();
    model.forward(ctx, b.seq, b.ids, b.targets);
    model.backward(ctx);
    opt.step(ctx, model.params(), 1e-2f);
    for (MoeLayer* m : model.moe_layers())
      if (m) {
        moved += m->last_overflow().rerouted;
        pairs += m->last_overflow().pairs;
        m->update_selection_bias(ctx);
      }
  }
  double tail = 0;
  for (const Batch& b : eval) tail += model.forward(ctx, b.seq, b.ids, b.targets) / 4;
  r.final_loss = tail;
  r.rerouted = pairs ? static_cast<double>(moved) / static_cast<double>(pairs) : 0.0;
  return r;
}

TEST(BalanceTraining, OverflowPolicyKeepsConvergence) {
  const uint64_t seed = test::test_seed();
  const Result off = train(false, 40, seed), on = train(true, 40, seed);
  std::printf("initial loss %.5f, final loss off %.5f on %.5f (%+.2f%%), rerouted %.2f%%\n",
              off.initial_loss, off.final_loss, on.final_loss,
              100 * (on.final_loss / off.final_loss - 1), 100 * on.rerouted);
  EXPECT_GT(on.rerouted, 0) << "the policy must bind for the comparison to mean anything";
  EXPECT_LE(on.rerouted, 0.05);
  // The 2% band below compares training only if training moved the loss well beyond it: by more
  // than twice the band from where it started. (It was 0.93 ln V, tuned on one draw; fresh draws
  // start at 4.15-4.28, above ln V = 4.11, and fall 9-15% in 40 steps, to 3.62-3.88: 5 of 24
  // missed 3.823.)
  EXPECT_LT(off.final_loss, off.initial_loss * (1 - 2 * 0.02)) << "training must make progress";
  EXPECT_LE(std::abs(on.final_loss / off.final_loss - 1), 0.02);
}

}  // namespace
}  // namespace mt
