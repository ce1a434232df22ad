// Load balancing in training (issue 7): the job's [balance] keys, TrainBalancer's wiring of the
// overflow policy, predictor, compensation and trace into a model, and ExpertParallel's per-step
// chunk setter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "harness/train_files.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "parallel/balance/routing_sim.h"
#include "parallel/balance/train_balancer.h"
#include "parallel/comm.h"
#include "parallel/expert_parallel.h"
#include "train/job.h"

namespace mt {
namespace {

using balance::BalanceOptions;
using balance::TrainBalancer;

const char* kJob = "[data]\ntrain = \"d\"\n";

TEST(TrainBalancer, JobKeysParseValidateAndRoundTrip) {
  const Job d = Job::parse(kJob, "job.toml");
  EXPECT_FALSE(d.balance.any()) << "every part must be off by default";
  const Job j = Job::parse(std::string(kJob) +
                               "[balance]\noverflow = true\ncapacity = 1.5\ncandidates = 3\n"
                               "reroute_budget = 0.1\npredict = true\nwindow = 4\n"
                               "ema_alpha = 0.5\ncompensate = true\nmax_chunks = 6\n"
                               "skew_experts = [0, 3]\nskew_bias = 0.25\ntrace = \"t.txt\"\n",
                           "job.toml");
  EXPECT_TRUE(j.balance.overflow);
  EXPECT_DOUBLE_EQ(j.balance.capacity, 1.5);
  EXPECT_EQ(j.balance.candidates, 3);
  EXPECT_DOUBLE_EQ(j.balance.reroute_budget, 0.1);
  EXPECT_EQ(j.balance.window, 4);
  EXPECT_EQ(j.balance.max_chunks, 6);
  EXPECT_EQ(j.balance.skew_experts, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(j.balance.trace, "t.txt");
  const Job back = Job::parse(j.to_toml(), "resolved");
  EXPECT_EQ(back.to_toml(), j.to_toml());
  EXPECT_EQ(back.balance.skew_experts, j.balance.skew_experts);
  EXPECT_DOUBLE_EQ(back.balance.skew_bias, 0.25);

  auto bad = [](const std::string& extra) {
    EXPECT_THROW(Job::parse(std::string(kJob) + "[balance]\n" + extra, "job.toml"), ConfigError)
        << extra;
  };
  bad("placement = true\n");  // without placement_every: refused rather than never moving
  EXPECT_TRUE(Job::parse(std::string(kJob) + "[balance]\nplacement = true\nplacement_every = 2\n",
                         "job.toml")
                  .balance.placement);
  bad("overflow = true\ncandidates = 0\n");
  bad("reroute_budget = 1.5\n");
  bad("capacity = 0\n");
  bad("ema_alpha = 0\n");
  bad("max_chunks = 0\n");
  bad("skew_experts = [\"a\"]\n");
  bad("nonsense = 1\n");
}

ModelConfig tiny_cfg() {
  ModelConfig cfg = ModelConfig::load("tiny");
  cfg.moe.n_group = 1;  // candidates beyond top-k must not be cut by the group limit
  cfg.moe.topk_group = 1;
  return cfg;
}

struct Data {
  SeqInfo seq;
  Tensor ids, targets;
};
Data make_data(int64_t vocab, int64_t docs, int64_t len, uint64_t seed) {
  Rng rng(seed);
  Data d;
  d.seq = SeqInfo::from_lengths(std::vector<int64_t>(static_cast<size_t>(docs), len));
  d.ids = Tensor::empty({d.seq.tokens}, DType::I32);
  d.targets = Tensor::empty({d.seq.tokens}, DType::I32);
  for (int64_t i = 0; i < d.seq.tokens; ++i) {
    d.ids.i32()[i] = static_cast<int32_t>(rng.below(vocab));
    d.targets.i32()[i] = static_cast<int32_t>(rng.below(vocab));
  }
  return d;
}

TEST(TrainBalancer, OverflowPolicyAndSkewOnEveryMoeLayer) {
  const ModelConfig cfg = tiny_cfg();
  Model model(cfg, 5);
  BalanceOptions o;
  o.overflow = true;
  o.capacity = 1.0;
  o.candidates = 2;
  o.reroute_budget = 0.1;
  o.skew_experts = {0};
  o.skew_bias = 2.0;  // above any sigmoid score gap: expert 0 tops every token's list
  TrainBalancer b(o, model, 2, nullptr);
  int moe = 0;
  for (int i = 0; i < model.num_layers(); ++i) {
    if (!model.moe_layers()[static_cast<size_t>(i)]) continue;
    ++moe;
    const Param& bias = model.params().at("model.layers." + std::to_string(i) +
                                          ".mlp.gate.e_score_correction_bias");
    for (int64_t e = 0; e < cfg.moe.num_experts; ++e)
      EXPECT_FLOAT_EQ(bias.value.f32()[e], e == 0 ? 2.f : 0.f) << "layer " << i << " expert " << e;
  }
  ASSERT_GT(moe, 0);

  const Data d = make_data(cfg.vocab, 4, 16, 9);
  Context ctx(ContextOptions{.seed = 1});
  model.forward(ctx, d.seq, d.ids, d.targets);
  b.after_forward(1);
  const int64_t T = d.seq.tokens, K = cfg.moe.top_k;
  int64_t rerouted = 0, pairs = 0;
  for (MoeLayer* m : model.moe_layers()) {
    if (!m) continue;
    const ops::OverflowStats& s = m->last_overflow();
    EXPECT_EQ(s.pairs, T * K) << "the policy must run on every MoE layer";
    EXPECT_EQ(s.max_expert_before, T) << "the skew must put expert 0 in every token's top-k";
    EXPECT_GT(s.rerouted, 0);
    EXPECT_LE(s.rerouted, static_cast<int64_t>(std::floor(0.1 * static_cast<double>(T * K))));
    rerouted += s.rerouted;
    pairs += s.pairs;
    // Only rerouting moves pairs off expert 0, and the hot expert sheds first.
    const Tensor& ids = m->last_expert_ids();
    int64_t on0 = 0;
    for (int64_t t = 0; t < T * K; ++t) on0 += ids.i32()[t] == 0;
    EXPECT_LT(on0, T);
    EXPECT_GE(on0, T - s.rerouted);
  }
  nlohmann::json line = nlohmann::json::object();
  b.add_metrics(line);
  ASSERT_TRUE(line.contains("balance"));
  EXPECT_DOUBLE_EQ(line["balance"]["rerouted_share"].get<double>(),
                   static_cast<double>(rerouted) / static_cast<double>(pairs));
  nlohmann::json again = nlohmann::json::object();
  b.add_metrics(again);  // counters reset per metrics line
  EXPECT_DOUBLE_EQ(again["balance"]["rerouted_share"].get<double>(), 0.0);
}

TEST(TrainBalancer, ForecastImbalanceAndChunksFollowTheLoads) {
  const ModelConfig cfg = tiny_cfg();  // 6 experts; 2 EP ranks hold 3 each
  ASSERT_EQ(cfg.moe.num_experts, 6);
  auto run = [&](double latency_us, const std::vector<int64_t>& load, bool compensate) {
    Model model(cfg, 5);
    BalanceOptions o;
    o.predict = true;
    o.compensate = compensate;
    o.latency_us = latency_us;
    o.max_chunks = 8;
    TrainBalancer b(o, model, 2, nullptr);
    std::vector<std::vector<int64_t>> loads(static_cast<size_t>(model.num_layers()));
    for (size_t i = 0; i < loads.size(); ++i)
      if (model.moe_layers()[i]) loads[i] = load;
    const int c = b.after_step(loads);
    return std::make_pair(c, b.forecast_imbalance());
  };
  // Rank 0 holds everything: its forecast is twice the mean of two ranks.
  const auto skewed = run(0, {300, 300, 300, 0, 0, 0}, true);
  EXPECT_DOUBLE_EQ(skewed.second, 2.0);
  // Without a per-chunk cost, pipelining more always hides more: the most chunks win.
  EXPECT_EQ(skewed.first, 8);
  // With a cost per chunk far above the whole exchange, one chunk wins.
  EXPECT_EQ(run(1e6, {300, 300, 300, 0, 0, 0}, true).first, 1);
  const auto even = run(0, {100, 100, 100, 100, 100, 100}, true);
  EXPECT_DOUBLE_EQ(even.second, 1.0);
  EXPECT_EQ(run(0, {300, 300, 300, 0, 0, 0}, false).first, 0) << "compensate off: no change";
}

TEST(TrainBalancer, TraceRecordsTheRoutersCandidates) {
  const ModelConfig cfg = tiny_cfg();
  // Its own directory (suite, name, pid): two test runs at once must not share the file.
  const std::string path = (test::temp_dir("trace") / "train_trace.txt").string();
  Model model(cfg, 5);
  const Data d = make_data(cfg.vocab, 2, 12, 4);
  std::vector<std::vector<std::set<int32_t>>> chosen;  // [layer][token] -> the router's top-k
  {
    BalanceOptions o;
    o.trace = path;
    o.candidates = 2;
    TrainBalancer b(o, model, 1, nullptr);
    Context ctx(ContextOptions{.seed = 1});
    model.forward(ctx, d.seq, d.ids, d.targets);
    b.after_forward(7);
    for (MoeLayer* m : model.moe_layers()) {
      if (!m) continue;
      chosen.emplace_back();
      const Tensor& ids = m->last_expert_ids();
      for (int64_t t = 0; t < d.seq.tokens; ++t)
        chosen.back().emplace_back(ids.i32() + t * cfg.moe.top_k,
                                   ids.i32() + (t + 1) * cfg.moe.top_k);
    }
  }
  balance::TraceHeader h;
  const std::vector<balance::TraceStep> steps = balance::read_trace(path, h);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  EXPECT_EQ(h.experts, cfg.moe.num_experts);
  EXPECT_EQ(h.top_k, cfg.moe.top_k);
  EXPECT_EQ(h.width, cfg.moe.top_k + 2);
  ASSERT_EQ(steps.size(), chosen.size()) << "one trace step per MoE layer and forward";
  for (size_t l = 0; l < steps.size(); ++l) {
    const balance::TraceStep& s = steps[l];
    EXPECT_EQ(s.step, 7);
    ASSERT_EQ(s.tokens, d.seq.tokens);
    for (int64_t t = 0; t < s.tokens; ++t) {
      const int32_t* c = s.cand.data() + t * h.width;
      const float* p = s.score.data() + t * h.width;
      EXPECT_EQ(std::set<int32_t>(c, c + h.top_k), chosen[l][static_cast<size_t>(t)])
          << "layer step " << l << " token " << t;
      EXPECT_EQ(std::set<int32_t>(c, c + h.width).size(), static_cast<size_t>(h.width));
      for (int64_t j = 1; j < h.width; ++j) EXPECT_GE(p[j - 1], p[j]);
    }
  }
}

// One-rank expert parallelism still cuts rows into chunks, so the per-step setter is exercised
// without MPI: changing it between forward and backward must not disturb backward, and every
// count gives the same function.
TEST(TrainBalancer, ExpertParallelChunkSetterKeepsResults) {
  const ModelConfig cfg = tiny_cfg();
  const Data d = make_data(cfg.vocab, 3, 10, 2);
  auto grads_with = [&](int fwd_chunks, int bwd_chunks, double& loss) {
    std::unique_ptr<par::Comm> comm = par::make_local_comm();
    Model model(cfg, 5);
    std::vector<std::unique_ptr<par::ExpertParallel>> eps;
    std::vector<ExpertCompute*> computes;
    for (MoeLayer* m : model.moe_layers())
      if (m) {
        eps.push_back(std::make_unique<par::ExpertParallel>(
            *comm, cfg.moe.num_experts, par::ExpertParallelOptions{.chunks = 1}));
        computes.push_back(eps.back().get());
      }
    model.shard_experts(0, cfg.moe.num_experts, computes);
    for (auto& e : eps) e->set_chunks(fwd_chunks);
    Context ctx(ContextOptions{.seed = 1});
    model.params().zero_grad();
    loss = model.forward(ctx, d.seq, d.ids, d.targets);
    for (auto& e : eps) e->set_chunks(bwd_chunks);
    model.backward(ctx);
    for (auto& e : eps) EXPECT_EQ(e->chunks(), bwd_chunks);
    std::vector<float> g;
    for (const Tensor& t : model.params().grads()) g.insert(g.end(), t.f32(), t.f32() + t.numel());
    return g;
  };
  double l1 = 0, l3 = 0, l31 = 0;
  const std::vector<float> g1 = grads_with(1, 1, l1), g3 = grads_with(3, 3, l3),
                           g31 = grads_with(3, 1, l31);
  EXPECT_NEAR(l3, l1, 1e-6);
  EXPECT_EQ(l31, l3);
  ASSERT_EQ(g1.size(), g3.size());
  for (size_t i = 0; i < g1.size(); ++i) {
    ASSERT_NEAR(g3[i], g1[i], 1e-6f + 1e-5f * std::abs(g1[i])) << i;
    ASSERT_EQ(g31[i], g3[i]) << "backward must keep its forward's chunk plan, element " << i;
  }
  EXPECT_THROW(par::ExpertParallel(*par::make_local_comm(), 6, {.chunks = 1}).set_chunks(0),
               ConfigError);
}

}  // namespace
}  // namespace mt
