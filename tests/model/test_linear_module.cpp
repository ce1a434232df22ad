#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "harness/op_check.h"
#include "model/linear_module.h"
#include "ref/linear_ref.h"

namespace mt::test {
namespace {

TEST(LinearModule, SpecsUsePeftNamesAndLayout) {
  LinearModule m("q_proj", 12, 7, {.rank = 3, .alpha = 6.f}, 0.05f);
  std::vector<ParamSpec> specs;
  m.add_specs(specs);
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].name, "q_proj.weight");
  EXPECT_EQ(specs[0].shape, Shape({7, 12}));
  EXPECT_EQ(specs[0].std, 0.05f);
  EXPECT_EQ(specs[1].name, "q_proj.lora_A.weight");
  EXPECT_EQ(specs[1].shape, Shape({3, 12}));
  EXPECT_EQ(specs[1].role, ParamRole::Lora);
  EXPECT_EQ(specs[2].name, "q_proj.lora_B.weight");
  EXPECT_EQ(specs[2].shape, Shape({7, 3}));
  EXPECT_EQ(specs[2].init, ParamInit::Zeros);
  std::vector<ParamSpec> plain;
  LinearModule("o_proj", 4, 4).add_specs(plain);
  EXPECT_EQ(plain.size(), 1u);
}

// Freshly initialised, the adapter is a no-op; the saved x A^T is exactly what plan() declared.
TEST(LinearModule, FreshAdapterIsANoOp) {
  Context ctx;
  Rng rng(ctx.rng().next_u64());
  LinearModule m("up_proj", 13, 9, {.rank = 2, .alpha = 4.f});
  std::vector<ParamSpec> specs;
  m.add_specs(specs);
  ParamTable table;
  std::map<std::string, DVec> values;
  for (const ParamSpec& s : specs) {
    Tensor t = Tensor::empty(s.shape);
    init_param(s, rng, t);
    table[s.name] = {.value = t, .grad = Tensor::zeros(s.shape)};
    values[s.name] = to_dvec(t);
  }
  m.bind(table);
  const int64_t T = 11;
  ArenaPlan plan;
  m.plan(T, plan);
  Arena acts(plan.bytes(), Device::CPU, "acts");
  Tensor x = Tensor::empty({T, 13}), y = Tensor::empty({T, 9});
  fill_normal(rng, x);
  LinearModule::Saved saved;
  m.forward(ctx, x, y, acts, saved);
  EXPECT_EQ(acts.used(), plan.bytes());
  DVec want = ref::matmul_nt(to_dvec(x), values["up_proj.weight"], T, 13, 9);
  EXPECT_LE(rel_err(to_dvec(y), want), 1e-6);
  // With B = 0 only B receives a gradient from the adapter.
  Tensor dy = Tensor::empty({T, 9}), dx = Tensor::empty({T, 13});
  fill_normal(rng, dy);
  m.backward(ctx, saved, dy, dx);
  for (double g : to_dvec(table["up_proj.lora_A.weight"].grad)) EXPECT_EQ(g, 0.0);
  double bsum = 0;
  for (double g : to_dvec(table["up_proj.lora_B.weight"].grad)) bsum += std::abs(g);
  EXPECT_GT(bsum, 0.0);
}

}  // namespace
}  // namespace mt::test
