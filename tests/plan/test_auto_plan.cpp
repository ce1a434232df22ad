// `--plan auto` choices (plan/auto_plan.h): with room it keeps the job's micro-batch and
// replicated experts; under a tighter limit it moves to EP or a smaller micro-batch (keeping
// batch x grad_accum) and the chosen plan's prediction is under the limit while the rejected one
// is over it; with no room it is a ConfigError carrying the planner's rejections.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "plan/auto_plan.h"

namespace mt::plan {
namespace {

AutoRequest request(int64_t world, double mem) {
  ModelConfig cfg = ModelConfig::load("tiny");
  cfg.moe.num_experts = 12;
  return {.cfg = cfg,
          .freeze_base = false,
          .world = world,
          .seq = 64,
          .batch = 8,
          .grad_accum = 1,
          .mem_bytes = mem,
          .mem_source = "test"};
}

MemoryBreakdown zero1(const AutoRequest& r, int64_t ep, int64_t mbs, bool shard = false,
                      Recompute rc = Recompute::None) {
  const ParallelPlan p{.world = r.world,
                       .fsdp = r.world,
                       .ep = ep,
                       .replicas = r.world / ep,
                       .expert_shard = shard ? r.world / ep : 1,
                       .mbs = mbs,
                       .seq = r.seq,
                       .recompute = rc,
                       .engine = Engine::Zero1Ep};
  return predict_memory(r.cfg, p, {.precision = Precision::fp32(), .freeze_base = false});
}

TEST(PlanAuto, AmpleMemoryKeepsTheJobsMicroBatchWithoutEp) {
  const AutoPlan a = choose_auto_plan(request(4, 64e9));
  EXPECT_EQ(a.ep, 1);  // no exchange to pay for
  EXPECT_EQ(a.a2a_chunks, 1);
  EXPECT_EQ(a.batch, 8);
  EXPECT_EQ(a.grad_accum, 1);
  EXPECT_EQ(a.chosen.plan.mbs, 2);
  EXPECT_EQ(a.chosen.plan.engine, Engine::Zero1Ep);
  EXPECT_NE(a.explanation.find("chosen: ep 1"), std::string::npos) << a.explanation;
}

TEST(PlanAuto, TightMemoryMovesToExpertParallelism) {
  AutoRequest r = request(4, 0);
  // Experts large enough to dominate (on tiny the exchange buffers outweigh what EP saves).
  r.cfg.moe.expert_ffn *= 32;
  // EP 1 at its smallest (expert state sharded over the 4 replicas) against EP 4.
  const double ep1 = zero1(r, 1, 2, true).total(), ep4 = zero1(r, 4, 2).total();
  ASSERT_LT(ep4, ep1);
  r.mem_bytes = (ep1 + ep4) / 2;
  const AutoPlan a = choose_auto_plan(r);
  EXPECT_GT(a.ep, 1) << a.explanation;
  EXPECT_EQ(a.batch, 8);
  EXPECT_LE(a.chosen.memory.total(), r.mem_bytes);
  EXPECT_NE(a.explanation.find("why not ep 1: never fits"), std::string::npos) << a.explanation;
}

TEST(PlanAuto, TighterMemoryShrinksTheMicroBatchAndKeepsTheStepSize) {
  AutoRequest r = request(2, 0);
  const double mbs4 = zero1(r, 2, 4).total(), mbs2 = zero1(r, 2, 2).total();
  ASSERT_LT(mbs2, mbs4);
  r.mem_bytes = (mbs4 + mbs2) / 2;
  const AutoPlan a = choose_auto_plan(r);
  EXPECT_EQ(a.chosen.plan.mbs, 2) << a.explanation;
  EXPECT_EQ(a.batch, 4);
  EXPECT_EQ(a.grad_accum, 2);
  EXPECT_NE(a.explanation.find("do not fit; grad_accum 1 -> 2"), std::string::npos)
      << a.explanation;
}

MemoryBreakdown fsdp_ep(const AutoRequest& r, int64_t ep, int64_t mbs, bool shard = false,
                        Recompute rc = Recompute::None) {
  ParallelPlan p{.world = r.world,
                 .fsdp = r.world,
                 .ep = ep,
                 .replicas = r.world / ep,
                 .expert_shard = shard ? r.world / ep : 1,
                 .mbs = mbs,
                 .seq = r.seq,
                 .recompute = rc,
                 .engine = Engine::FsdpEp};
  return predict_memory(r.cfg, p, {.precision = Precision::fp32(), .freeze_base = false});
}

TEST(PlanAuto, FsdpWhenZero1FitsNoMicroBatch) {
  AutoRequest r = request(4, 0);
  // Many blocks, short sequences: dense state outweighs activations, and sharding it saves far
  // more than two gathered blocks cost.
  const std::vector<LayerIR> block = r.cfg.layers;
  for (int i = 0; i < 5; ++i) r.cfg.layers.insert(r.cfg.layers.end(), block.begin(), block.end());
  r.seq = 16;
  double zero1_min = 1e300, fsdp_min = 1e300;
  for (int64_t ep : {1, 2, 4})
    for (bool shard : {false, true})
      for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        zero1_min = std::min(zero1_min, zero1(r, ep, 1, shard, rc).total());
        fsdp_min = std::min(fsdp_min, fsdp_ep(r, ep, 1, shard, rc).total());
      }
  ASSERT_LT(fsdp_min, zero1_min);
  r.mem_bytes = (zero1_min + fsdp_min) / 2;
  const AutoPlan a = choose_auto_plan(r);
  EXPECT_TRUE(a.fsdp) << a.explanation;
  EXPECT_EQ(a.chosen.plan.engine, Engine::FsdpEp);
  EXPECT_LE(a.chosen.memory.total(), r.mem_bytes);
  EXPECT_EQ(a.batch * a.grad_accum, 8);
  EXPECT_NE(
      a.explanation.find("1 sequence(s) per rank, engine zero1+ep, any recompute: nothing fits"),
      std::string::npos)
      << a.explanation;
  // A job that asks for FSDP is planned for it even with room.
  r.mem_bytes = 64e9;
  r.fsdp = true;
  EXPECT_EQ(choose_auto_plan(r).chosen.plan.engine, Engine::FsdpEp);
  // One rank has nothing to shard over.
  AutoRequest one = request(1, 64e9);
  EXPECT_FALSE(choose_auto_plan(one).fsdp);
}

// Memory that no micro-batch meets without recompute, but one does with it: the job keeps the
// zero1+ep engine and recomputes (selective if it fits, else full) rather than gather weights.
TEST(PlanAuto, RecomputeWhenNoMicroBatchFitsWithoutIt) {
  AutoRequest r = request(2, 0);
  r.seq = 256;  // activation-bound
  double none = 1e300, replay = 1e300;
  for (int64_t ep : {1, 2})
    for (bool shard : {false, true}) {
      none = std::min(none, zero1(r, ep, 1, shard).total());
      replay = std::min(replay, zero1(r, ep, 1, shard, Recompute::Full).total());
    }
  ASSERT_LT(replay, none);
  r.mem_bytes = (none + replay) / 2;
  const AutoPlan a = choose_auto_plan(r);
  EXPECT_NE(a.recompute, Recompute::None) << a.explanation;
  EXPECT_EQ(a.chosen.plan.recompute, a.recompute);
  EXPECT_EQ(a.chosen.plan.engine, Engine::Zero1Ep);
  EXPECT_LE(a.chosen.memory.total(), r.mem_bytes);
  EXPECT_NE(a.explanation.find("engine zero1+ep, no recompute: nothing fits"), std::string::npos)
      << a.explanation;
  EXPECT_NE(a.explanation.find("recompute " + std::string(recompute_name(a.recompute))),
            std::string::npos)
      << a.explanation;
}

// Experts that dominate the bytes of many MoE layers, 6 of them on 4 ranks (EP 1 or 2, as 896
// experts of seed-2.8t leave EP short of the world when the exchange should stay small), and a
// limit that only ZeRO-3 experts meet (fsdp+ep with expert_shard = replicas): the plan shards
// the expert weights (parallel.shard_expert_weights).
TEST(PlanAuto, ExpertWeightsShardedWhenOnlyThatFits) {
  AutoRequest r = request(4, 0);
  r.cfg.moe.num_experts = 6;
  r.cfg.moe.expert_ffn *= 16;
  const std::vector<LayerIR> block = r.cfg.layers;
  for (int i = 0; i < 5; ++i) r.cfg.layers.insert(r.cfg.layers.end(), block.begin(), block.end());
  r.seq = 16;
  double other = 1e300, zero3 = 1e300;
  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full})
    for (int64_t ep : {1, 2})
      for (bool shard : {false, true}) {
        other = std::min(other, zero1(r, ep, 1, shard, rc).total());
        if (shard)
          zero3 = std::min(zero3, fsdp_ep(r, ep, 1, true, rc).total());
        else
          other = std::min(other, fsdp_ep(r, ep, 1, shard, rc).total());
      }
  ASSERT_LT(zero3, other);
  r.mem_bytes = (zero3 + other) / 2;
  const AutoPlan a = choose_auto_plan(r);
  EXPECT_TRUE(a.shard_expert_weights) << a.explanation;
  EXPECT_TRUE(a.shard_experts && a.fsdp);
  EXPECT_EQ(a.chosen.plan.engine, Engine::FsdpEp);
  EXPECT_GT(a.chosen.plan.expert_shard, 1);
  EXPECT_LE(a.chosen.memory.total(), r.mem_bytes);
  EXPECT_NE(a.explanation.find("shard_expert_weights on"), std::string::npos) << a.explanation;
}

TEST(PlanAuto, NothingFitsIsAConfigErrorWithTheRejections) {
  AutoRequest r = request(2, 0);
  r.mem_bytes = zero1(r, 2, 1).total() * 0.5;
  try {
    choose_auto_plan(r);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no parallel plan fits"), std::string::npos) << m;
    EXPECT_NE(m.find("over memory, largest part"), std::string::npos) << m;
    EXPECT_NE(m.find("closest ep 2"), std::string::npos) << m;
  }
}

TEST(PlanAuto, BatchThatDoesNotSplitIsAConfigError) {
  AutoRequest r = request(3, 64e9);
  r.batch = 4;
  EXPECT_THROW(choose_auto_plan(r), ConfigError);
}

}  // namespace
}  // namespace mt::plan
