// `moetrain bench step` on the CPU with the planner's own workspace estimate (no override): the
// estimate must hold every op's scratch at the thread count the context runs, or the step stops
// with the arena's MemoryError. The CPU KDA core's scratch is per thread, so the check runs on
// three threads whatever the machine has.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/seed.h"
#include "io/hf_names.h"
#include "train/bench_step.h"

namespace mt {
namespace {

TEST(StepBench, CpuStepFitsThePlannedWorkspaceOnSeveralThreads) {
  std::ostringstream log;
  nlohmann::json j;
  EXPECT_NO_THROW(j = run_step_bench({.model = "tiny",
                                      .tokens = 64,
                                      .warmup = 0,
                                      .steps = 1,
                                      .precision = "fp32",
                                      .device = "cpu",
                                      .threads = 3,
                                      .seed = test::test_seed()},
                                     log))
      << log.str();
  ASSERT_TRUE(j.contains("ms_per_step")) << log.str();
  EXPECT_GT(j["ms_per_step"].get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
  EXPECT_EQ(j["device"], "cpu (3 threads)");
}

// Every step trains on the same batch, so with a learning rate that shows in a few steps the loss
// falls from step to step (issue 13's "a few training steps whose loss falls" runs this way at
// 131072 tokens on the GPU); the losses array lists the warm-up steps' too.
TEST(StepBench, RepeatedBatchLossFallsAtTheGivenRate) {
  const uint64_t seed = test::test_seed();
  const auto losses_at = [&](float lr) {
    std::ostringstream log;
    nlohmann::json j;
    EXPECT_NO_THROW(j = run_step_bench({.model = "tiny",
                                        .tokens = 48,
                                        .warmup = 1,
                                        .steps = 3,
                                        .lora_targets = {},
                                        .precision = "fp32",
                                        .device = "cpu",
                                        .threads = 2,
                                        .seed = seed,
                                        .lr = lr},
                                       log))
        << log.str();
    EXPECT_FLOAT_EQ(j["lr"].get<float>(), lr);
    EXPECT_TRUE(j["loss_fell"].get<bool>()) << log.str();
    return j["losses"].get<std::vector<double>>();
  };
  const std::vector<double> fast = losses_at(1e-2f), slow = losses_at(1e-4f);
  ASSERT_EQ(fast.size(), 4u);
  ASSERT_EQ(slow.size(), 4u);
  EXPECT_EQ(fast[0], slow[0]);  // the same model and batch before the first update
  for (size_t i = 1; i < fast.size(); ++i) EXPECT_LT(fast[i], fast[i - 1]);
  // The rate is the one given: a hundred times the rate moves the loss far more (about 1.6 nats
  // against 0.08 over three updates on tiny).
  EXPECT_GT(fast[0] - fast[3], 5 * (slow[0] - slow[3]));
}

// --plan-only: the planner's prediction for the GPU step, with nothing built (no device here).
TEST(StepBench, PlanOnlyPredictsWithoutADevice) {
  std::ostringstream log;
  const nlohmann::json j =
      run_step_bench({.model = "tiny", .tokens = 4096, .device = "cuda", .plan_only = true}, log);
  EXPECT_TRUE(j["plan_only"].get<bool>());
  EXPECT_EQ(j["device"], "cuda");
  EXPECT_GT(j["planner_total_gib"].get<double>(), 0.0);
  EXPECT_GT(j["planner"]["activations"].get<double>(), 0.0);
  EXPECT_FALSE(j.contains("ms_per_step"));
  EXPECT_TRUE(log.str().empty()) << log.str();
}

// bench/models/kimi-linear-8l-dsa.json (issue 13's step benchmark with gated DSA in place of
// MLA) is kimi-linear-8l with its full-attention layers as DSA layers at the benchmark layer's
// indexer (8 x 64, top-2048, the output gate on) and everything else equal; a copy shrunk to
// CPU size, same layer kinds, runs a step of bench step over a document longer than its top-k
// (the sparse stage: selection, absorbed attention, the KL), and its loss falls.
TEST(StepBench, DsaStepModelIsKimiLinearWithDsaAndRunsShrunk) {
  const std::string dir = MT_BENCH_MODELS;
  const ModelConfig mla = load_model_config(dir + "/kimi-linear-8l.json").model,
                    dsa = ModelConfig::load(dir + "/kimi-linear-8l-dsa.json");
  ASSERT_EQ(dsa.layers.size(), mla.layers.size());
  int dsa_layers = 0;
  for (size_t i = 0; i < mla.layers.size(); ++i) {
    SCOPED_TRACE(i);
    const MixerKind want = mla.layers[i].mixer == MixerKind::Mla ? MixerKind::Dsa : MixerKind::Kda;
    EXPECT_EQ(dsa.layers[i].mixer, want);
    EXPECT_EQ(dsa.layers[i].ffn, mla.layers[i].ffn);
    dsa_layers += want == MixerKind::Dsa;
  }
  EXPECT_EQ(dsa_layers, 2);
  EXPECT_EQ(dsa.vocab, mla.vocab);
  EXPECT_EQ(dsa.hidden, mla.hidden);
  EXPECT_EQ(dsa.kda.heads, mla.kda.heads);
  EXPECT_EQ(dsa.kda.head_dim, mla.kda.head_dim);
  EXPECT_EQ(dsa.dense.ffn, mla.dense.ffn);
  EXPECT_EQ(dsa.moe.num_experts, mla.moe.num_experts);
  EXPECT_EQ(dsa.moe.top_k, mla.moe.top_k);
  EXPECT_EQ(dsa.moe.expert_ffn, mla.moe.expert_ffn);
  EXPECT_EQ(dsa.moe.num_shared, mla.moe.num_shared);
  EXPECT_FLOAT_EQ(dsa.moe.routed_scaling, mla.moe.routed_scaling);
  const MlaConfig& a = dsa.dsa.mla;
  EXPECT_EQ(a.heads, mla.mla.heads);
  EXPECT_EQ(a.kv_lora_rank, mla.mla.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_dim, mla.mla.qk_nope_dim);
  EXPECT_EQ(a.qk_rope_dim, mla.mla.qk_rope_dim);
  EXPECT_EQ(a.v_head_dim, mla.mla.v_head_dim);
  EXPECT_GT(a.q_lora_rank, 0);  // the indexer reads the query latent
  EXPECT_TRUE(a.output_gate);
  EXPECT_EQ(dsa.dsa.index_heads, 8);
  EXPECT_EQ(dsa.dsa.index_head_dim, 64);
  EXPECT_EQ(dsa.dsa.index_topk, 2048);

  nlohmann::json small = dsa.to_json();
  small["vocab_size"] = 512;
  small["hidden_size"] = 64;
  small["intermediate_size"] = 96;
  small["linear_attn_config"]["num_heads"] = 2;
  small["linear_attn_config"]["head_dim"] = 16;
  small["num_attention_heads"] = 4;
  small["q_lora_rank"] = 32;
  small["kv_lora_rank"] = 32;
  small["qk_nope_head_dim"] = 16;
  small["qk_rope_head_dim"] = 8;
  small["v_head_dim"] = 16;
  small["index_n_heads"] = 2;
  small["index_head_dim"] = 16;
  small["index_topk"] = 64;
  small["n_routed_experts"] = 8;
  small["num_experts_per_tok"] = 2;
  small["moe_intermediate_size"] = 32;
  small["moe_latent_size"] = 64;
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() /
      ("moetrain_dsa_step_" + std::to_string(test::case_seed()) + ".json");
  std::ofstream(file) << small.dump();
  std::ostringstream log;
  nlohmann::json j;
  EXPECT_NO_THROW(j = run_step_bench({.model = file.string(),
                                      .tokens = 200,  // past top-64: the sparse stage
                                      .warmup = 1,
                                      .steps = 1,
                                      .precision = "fp32",
                                      .device = "cpu",
                                      .threads = 2,
                                      .seed = test::test_seed(),
                                      .lr = 1e-3f},
                                     log))
      << log.str();
  std::filesystem::remove(file);
  ASSERT_TRUE(j.contains("losses")) << log.str();
  const std::vector<double> losses = j["losses"];
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(losses[0]));
  EXPECT_LT(losses[1], losses[0]) << log.str();
}

}  // namespace
}  // namespace mt
