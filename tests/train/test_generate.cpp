// Sampling (greedy, temperature, top-p) against independently computed distributions, and the
// Generator's seeding and input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>

#include "harness/seed.h"
#include "train/bench_decode.h"
#include "train/generate.h"

namespace mt {
namespace {

std::vector<float> random_logits(std::mt19937& gen, int64_t V) {
  std::normal_distribution<float> n(0.f, 1.5f);
  std::vector<float> l(static_cast<size_t>(V));
  for (float& x : l) x = n(gen);
  return l;
}

TEST(Sampling, GreedyAndTinyNucleusPickTheArgmax) {
  std::mt19937 gen(std::random_device{}());
  Rng rng(gen());
  const std::vector<float> l = random_logits(gen, 37);
  const int32_t arg = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  EXPECT_EQ(sample_token(l.data(), 37, {.temperature = 0.f}, rng), arg);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(sample_token(l.data(), 37, {.temperature = 1.f, .top_p = 1e-6f}, rng), arg);
}

// Draw frequencies against softmax(l / T) restricted to the nucleus, within 5 standard errors.
void check_frequencies(float temperature, float top_p) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message()
               << "seed=" << seed << " T=" << temperature << " top_p=" << top_p);
  std::mt19937 gen(seed);
  const int64_t V = 6;
  const std::vector<float> l = random_logits(gen, V);
  std::vector<double> p(V);
  for (int64_t i = 0; i < V; ++i) p[i] = std::exp(double(l[i]) / temperature);
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= z;
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  std::vector<double> q(V, 0.0);
  double mass = 0;
  for (int64_t i : order) {
    q[i] = p[i];
    mass += p[i];
    if (mass >= top_p) break;
  }
  for (double& x : q) x /= mass;
  Rng rng(gen());
  const int N = 40000;
  std::vector<int> count(V, 0);
  for (int i = 0; i < N; ++i)
    ++count[sample_token(l.data(), V, {.temperature = temperature, .top_p = top_p}, rng)];
  for (int64_t i = 0; i < V; ++i) {
    const double f = double(count[i]) / N, se = std::sqrt(q[i] * (1 - q[i]) / N) + 1e-9;
    if (q[i] == 0)
      EXPECT_EQ(count[i], 0) << "id " << i << " outside the nucleus";
    else
      EXPECT_LT(std::abs(f - q[i]), 5 * se) << "id " << i;
  }
}

TEST(Sampling, TemperatureMatchesSoftmax) {
  check_frequencies(0.7f, 1.f);
}
TEST(Sampling, TopPKeepsTheNucleus) {
  check_frequencies(1.3f, 0.6f);
}

TEST(Generator, SeededAndChecked) {
  const uint64_t seed = std::random_device{}();
  ModelConfig cfg = ModelConfig::load("tiny");
  Model model(cfg, seed);
  Context ctx;
  Generator g(model);
  const std::vector<int32_t> prompt = {1, 5, 9, static_cast<int32_t>(seed % 61)};
  const SamplingOptions s{.max_new = 12, .temperature = 1.f, .top_p = 0.9f, .seed = seed};
  std::vector<int32_t> streamed;
  const std::vector<int32_t> a =
      g.generate(ctx, prompt, s, [&](int32_t t) { streamed.push_back(t); });
  EXPECT_EQ(a.size(), 12u);
  EXPECT_EQ(a, streamed);
  EXPECT_EQ(g.generate(ctx, prompt, s), a);  // same seed, same text
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < cfg.vocab);
  EXPECT_THROW(g.generate(ctx, {}, s), ValueError);
  EXPECT_THROW(g.generate(ctx, {3, 61}, s), ValueError);
  EXPECT_THROW(g.generate(ctx, prompt, {.temperature = -1.f}), ValueError);
  EXPECT_THROW(g.generate(ctx, prompt, {.top_p = 0.f}), ValueError);
}

// `moetrain bench decode` on the CPU: both KDA paths time positive rates and, from the same
// prompt, decode the same greedy ids (fp32: the paths differ by float rounding, far below the
// logit gaps of a random model); bad sizes are refused.
TEST(DecodeBench, RecurrentAndChunkedStepsDecodeTheSameGreedyIds) {
  const uint64_t seed = test::test_seed();
  std::ostringstream log;
  const nlohmann::json j = run_decode_bench({.model = "tiny",
                                             .prompt = 24,
                                             .tokens = 8,
                                             .precision = "fp32",
                                             .device = "cpu",
                                             .workspace_gib = 0.25,
                                             .seed = seed},
                                            log);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["kda_step"], "recurrent");
  EXPECT_EQ(j["runs"][1]["kda_step"], "chunked");
  for (const auto& r : j["runs"]) {
    EXPECT_GT(r["prompt_tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(r["decode_tokens_per_s"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["greedy_ids_agree_for"].get<int64_t>(), 8) << log.str();
  EXPECT_THROW(run_decode_bench({.model = "tiny", .prompt = 0, .device = "cpu"}, log), ValueError);
}

}  // namespace
}  // namespace mt
