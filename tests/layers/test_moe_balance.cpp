// MoeLayer with the bounded overflow policy (ops/overflow_route.h) switched on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "harness/op_check.h"
#include "harness/seed.h"
#include "model/moe_layer.h"

namespace mt {
namespace {

struct LayerRun {
  std::vector<float> y, dx, dgate;
  std::vector<int32_t> ids;
  ops::OverflowStats st;
};

// One forward/backward of a fresh layer on parameters drawn from `seed` (experts 0-1 made hot via
// the gate): the runs a test compares share the seed.
LayerRun run_layer(uint64_t seed, const ops::OverflowParams* policy) {
  MoeConfig c{.hidden = 21, .latent = 13, .num_experts = 8, .top_k = 2, .expert_ffn = 11};
  MoeLayer layer(c);
  const SeqInfo seq = SeqInfo::from_lengths({40});
  Rng rng(seed);
  ParamTable table;
  std::vector<Tensor> keep;
  for (const ParamSpec& s : layer.param_specs()) {
    ParamRef r{.value = Tensor::empty(s.shape), .grad = Tensor::zeros(s.shape)};
    test::fill_normal(rng, r.value, 0.3);
    // Experts 0-1 hot whatever the draw: a large weight on x's column 0, which is 1.5 for every
    // token, lifts their logits by 3 (a push over whole rows had the sign of sum(x) and left
    // some draws unbound: MOETRAIN_TEST_SEED=18264141269275200736).
    if (s.name == "gate.weight")
      for (int64_t e = 0; e < 2; ++e) r.value.f32()[e * c.hidden] += 2.f;
    table[s.name] = r;
  }
  layer.bind(table);
  if (policy) layer.set_overflow_policy(*policy, ops::contiguous_expert_ranks(8, 2));
  Context ctx;
  Tensor x = Tensor::empty({40, c.hidden}), y = Tensor::empty({40, c.hidden});
  Tensor dy = Tensor::empty({40, c.hidden}), dx = Tensor::empty({40, c.hidden});
  test::fill_normal(rng, x);
  for (int64_t i = 0; i < 40; ++i) x.f32()[i * c.hidden] = 1.5f;  // shared push towards 0-1
  test::fill_normal(rng, dy);
  ArenaPlan plan;
  layer.plan_activations(seq, plan);
  Arena acts(plan.bytes(), Device::CPU, "acts");
  MoeLayer::Saved st;
  layer.forward(ctx, seq, x, y, acts, st);
  layer.backward(ctx, seq, dy, dx, st);
  LayerRun r;
  r.y.assign(y.f32(), y.f32() + y.numel());
  r.dx.assign(dx.f32(), dx.f32() + dx.numel());
  const Tensor& g = table["gate.weight"].grad;
  r.dgate.assign(g.f32(), g.f32() + g.numel());
  const Tensor& ids = layer.last_expert_ids();
  r.ids.assign(ids.i32(), ids.i32() + ids.numel());
  r.st = layer.last_overflow();
  return r;
}

TEST(MoeBalance, UnboundPolicyIsTheRouter) {
  const ops::OverflowParams none{.extra = 3, .expert_capacity = 0.f, .rank_capacity = 0.f};
  const uint64_t seed = test::test_seed();
  const LayerRun a = run_layer(seed, nullptr), b = run_layer(seed, &none);
  EXPECT_EQ(b.st.rerouted, 0);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dgate, b.dgate);
}

TEST(MoeBalance, BoundPolicyReroutesWithinCapacity) {
  const ops::OverflowParams p{
      .extra = 3, .expert_capacity = 1.2f, .rank_capacity = 0.f, .max_reroute_share = 0.5f};
  const uint64_t seed = test::test_seed();
  const LayerRun a = run_layer(seed, nullptr), b = run_layer(seed, &p);
  EXPECT_GT(b.st.rerouted, 0);
  std::vector<int64_t> la(8, 0), lb(8, 0);
  for (int32_t e : a.ids) ++la[e];
  for (int32_t e : b.ids) ++lb[e];
  EXPECT_GT(*std::max_element(la.begin(), la.end()), b.st.expert_cap) << "the case must bind";
  for (int e = 0; e < 8; ++e) {
    if (lb[e] > la[e]) {
      EXPECT_LE(lb[e], b.st.expert_cap);
    }
  }
  EXPECT_LT(*std::max_element(lb.begin(), lb.end()), *std::max_element(la.begin(), la.end()));
  EXPECT_NE(a.y, b.y);
  for (float v : b.dgate) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace mt
