// Load balancing: predictor, chunk choice, placement, trace format and the routing simulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "core/error.h"
#include "parallel/balance/load_predictor.h"
#include "parallel/balance/routing_sim.h"

namespace mt::balance {
namespace {

TEST(Balance, PredictorEmaWindowAndFlags) {
  LoadPredictor p(2, {0, 0, 1, 1}, {.ema_alpha = 0.5, .window = 2, .hot_factor = 1.5});
  EXPECT_EQ(p.predicted_rank_imbalance(0), 1.0);
  p.observe(0, {10, 10, 10, 10});
  EXPECT_EQ(p.forecast(0), (std::vector<double>{10, 10, 10, 10}));
  p.observe(0, {40, 0, 0, 0});
  // EMA: 0.5*10 + 0.5*40 = 25 (and 5); window mean: 25 (and 5); forecast: their mean.
  EXPECT_DOUBLE_EQ(p.ema(0)[0], 25);
  EXPECT_DOUBLE_EQ(p.ema(0)[1], 5);
  EXPECT_DOUBLE_EQ(p.forecast(0)[0], 25);
  p.observe(0, {40, 0, 0, 0});
  // Window now holds only the two hot steps (40): the forecast follows faster than the EMA.
  EXPECT_DOUBLE_EQ(p.ema(0)[0], 32.5);
  EXPECT_DOUBLE_EQ(p.window_mean(0)[0], 40);
  EXPECT_DOUBLE_EQ(p.forecast(0)[0], 36.25);
  const auto hot = p.hot_experts(0);
  EXPECT_EQ(hot, (std::vector<char>{1, 0, 0, 0}));
  const auto rf = p.rank_forecast(0);
  EXPECT_DOUBLE_EQ(rf[0], p.forecast(0)[0] + p.forecast(0)[1]);
  EXPECT_GT(p.predicted_rank_imbalance(0), 1.5);
  EXPECT_EQ(p.hot_ranks(0), (std::vector<char>{1, 0}));
  EXPECT_EQ(p.steps_seen(1), 0);  // layers are independent
  EXPECT_THROW(p.observe(0, {1, 2}), ShapeError);
  EXPECT_THROW(p.observe(2, {1, 2, 3, 4}), ValueError);
}

TEST(Balance, ChunksMinimiseModeledTime) {
  // a = c = 1 ms, latency 20 us: t(C) = 1ms*(2/C + (C-1)/C) + C*20us, minimal at C = sqrt(50).
  const int c = chunks_for_forecast(1e-3, 1e-3, 20e-6, 16);
  for (int k = 1; k <= 16; ++k)
    EXPECT_LE(pipelined_time(1e-3, 1e-3, 20e-6, c), pipelined_time(1e-3, 1e-3, 20e-6, k));
  EXPECT_EQ(c, 7);
  EXPECT_EQ(chunks_for_forecast(1e-3, 1e-3, 20e-6, 1), 1);
  // A hotter rank (more to overlap) is given more chunks.
  EXPECT_GT(chunks_for_forecast(4e-3, 4e-3, 20e-6, 32), c);
  EXPECT_DOUBLE_EQ(pipelined_time(2, 3, 0, 1), 5);
}

TEST(Balance, GreedyPlacementBalancesRanks) {
  std::vector<double> load(32);
  for (int i = 0; i < 32; ++i) load[i] = i < 4 ? 30.0 : 1.0;  // four hot experts, contiguous
  const auto where = greedy_placement(load, 4);
  std::vector<double> rl(4, 0.0);
  std::vector<int> slots(4, 0);
  for (int e = 0; e < 32; ++e) {
    rl[where[e]] += load[e];
    ++slots[where[e]];
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(slots[r], 8);
  // Contiguous placement puts all four on rank 0 (max 124); balanced packing: 37 each.
  EXPECT_DOUBLE_EQ(*std::max_element(rl.begin(), rl.end()), 37.0);
  EXPECT_THROW(greedy_placement(load, 5), ConfigError);
}

SimOptions small() {
  SimOptions o;
  o.experts = 64;
  o.top_k = 4;
  o.ranks = 16;
  o.ep = 8;
  o.tokens_per_rank = 512;
  o.sample_per_rank = 64;
  o.steps = 40;
  o.extra = 4;
  o.threads = 2;
  return o;
}

// Each policy is measured against the best fixed chunk count, not against one chunk: the
// baseline is the fastest of the policies-off runs, and the chunking-only run can only match or
// beat a fixed count it could itself have chosen when its forecast is right.
TEST(Balance, PoliciesAreComparedWithTheStrongestStaticBaseline) {
  SimOptions o = small();
  o.max_chunks = 4;
  const PolicyComparison c = compare_policies(o);
  ASSERT_GE(c.best_chunks, o.base_chunks);
  ASSERT_LE(c.best_chunks, o.max_chunks);
  for (int k = o.base_chunks; k <= o.max_chunks; ++k) {
    SimOptions x = o;
    x.base_chunks = k;
    const SimSummary s = simulate_routing(x);
    EXPECT_LE(c.best_static.mean.time_max_s, s.mean.time_max_s) << k << " chunks";
    if (k == c.best_chunks) {
      EXPECT_EQ(s.mean.time_max_s, c.best_static.mean.time_max_s);
    }
    if (k == o.base_chunks) {
      EXPECT_EQ(s.mean.time_max_s, c.given.mean.time_max_s);
    }
  }
  EXPECT_EQ(c.best_static.mean.rerouted_share, 0);
  EXPECT_EQ(c.chunking.mean.rerouted_share, 0);
  EXPECT_GT(c.reroute.mean.rerouted_share, 0);
  EXPECT_EQ(c.reroute.chunks, c.best_chunks);  // rerouting alone keeps the baseline's chunks
  // Rerouting evens the ranks' load whatever the chunking.
  EXPECT_LT(c.reroute.mean.rank_max_mean, c.best_static.mean.rank_max_mean);
  EXPECT_LT(c.both.mean.idle_mean_s, c.best_static.mean.idle_mean_s);
}

TEST(Balance, SimulatorPoliciesReduceIdle) {
  SimOptions o = small();
  const SimSummary off = simulate_routing(o);
  EXPECT_EQ(off.mean.rerouted_share, 0);
  EXPECT_GT(off.mean.rank_max_mean, 1.05);
  EXPECT_GT(off.mean.hot_cold, 5);
  o.overflow = o.compensate = true;
  const SimSummary on = simulate_routing(o);
  EXPECT_LE(on.mean.rerouted_share, o.max_reroute_share + 1e-12);
  EXPECT_GT(on.mean.rerouted_share, 0);
  EXPECT_LT(on.mean.rank_max_mean, off.mean.rank_max_mean);
  EXPECT_LT(on.mean.idle_mean_s, off.mean.idle_mean_s);
  // Same seed, same trace: the figures repeat exactly.
  const SimSummary again = simulate_routing(o);
  EXPECT_EQ(again.mean.idle_mean_s, on.mean.idle_mean_s);
}

TEST(Balance, RecordedTraceReplaysToSameFigures) {
  const std::string path = ::testing::TempDir() + "balance_trace.txt";
  SimOptions o = small();
  o.steps = 5;
  o.overflow = true;
  o.record = path;
  std::vector<SimStep> rec, rep;
  simulate_routing(o, [&](const SimStep& s) { rec.push_back(s); });
  TraceHeader h;
  const auto steps = read_trace(path, h);
  EXPECT_EQ(h.experts, 64);
  EXPECT_EQ(h.top_k, 4);
  EXPECT_EQ(h.width, 8);
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps[0].tokens, 16 * 64);
  o.record.clear();
  o.trace = path;
  simulate_routing(o, [&](const SimStep& s) { rep.push_back(s); });
  ASSERT_EQ(rep.size(), rec.size());
  for (size_t i = 0; i < rec.size(); ++i) {
    EXPECT_EQ(rep[i].expert_max_mean, rec[i].expert_max_mean);
    EXPECT_EQ(rep[i].rerouted_share, rec[i].rerouted_share);
    EXPECT_DOUBLE_EQ(rep[i].idle_mean_s, rec[i].idle_mean_s);
  }
  std::remove(path.c_str());
}

TEST(Balance, TraceErrorsNameFileAndLine) {
  const std::string path = ::testing::TempDir() + "bad_trace.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_TRUE(f);
  std::fputs(
      "moetrain-routing-trace 1\nexperts 4 top_k 1 width 2\nstep 0 layer 0 tokens 1\n0 7 1 "
      "0.5\n",
      f);
  std::fclose(f);
  TraceHeader h;
  try {
    read_trace(path, h);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(":4:"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(read_trace(path, h), IoError);
  SimOptions o = small();
  o.ep = 3;
  EXPECT_THROW(simulate_routing(o), ConfigError);
}

}  // namespace
}  // namespace mt::balance
