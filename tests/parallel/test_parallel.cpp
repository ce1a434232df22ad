// Single-process parts of src/parallel: mesh validation, the world-of-one Comm, and the chunked
// expert exchange on one rank against the grouped FFN run directly (same rows, same weights).
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "harness/seed.h"
#include "ops/grouped_ffn.h"
#include "parallel/comm.h"
#include "parallel/expert_parallel.h"
#include "parallel/mesh.h"

namespace mt::par {
namespace {

TEST(Mesh, GroupsFollowRankLayout) {
  const Mesh m = make_mesh(4, 3, 12, {.ep = 2});
  EXPECT_EQ(m.replicas, 2);
  EXPECT_EQ(m.ep_rank, 1);
  EXPECT_EQ(m.replica, 1);
  EXPECT_EQ(m.local_experts, 6);
  EXPECT_EQ(m.first_expert(), 6);
  EXPECT_NE(m.describe().find("experts [6, 12): ranks 1 3"), std::string::npos) << m.describe();
}

TEST(Mesh, RejectsEpThatDividesNeitherWorldNorExperts) {
  EXPECT_THROW(make_mesh(4, 0, 12, {.ep = 3}), ConfigError);  // world
  EXPECT_THROW(make_mesh(4, 0, 6, {.ep = 4}), ConfigError);   // experts
  EXPECT_THROW(make_mesh(4, 0, 12, {.ep = 0}), ConfigError);
  EXPECT_NO_THROW(make_mesh(3, 2, 12, {.ep = 3}));
}

TEST(LocalComm, CollectivesAreCopiesAndCounted) {
  auto c = make_local_comm();
  float a[3] = {1, 2, 3}, b[3] = {0, 0, 0};
  c->all_gather(a, 3, b, Elem::F32);
  EXPECT_EQ(b[2], 3.f);
  c->all_reduce(a, 3, Elem::F32);
  EXPECT_EQ(a[1], 2.f);
  int64_t s[4] = {5, 6, 7, 8}, r[4] = {0, 0, 0, 0};
  c->iall_to_all_v(s, {2}, {1}, r, {2}, {2}, Elem::I64).wait();
  EXPECT_EQ(r[2], 6);
  EXPECT_EQ(r[3], 7);
  EXPECT_EQ(c->stats().at(Collective::AllGather).bytes_recv, 12);
  EXPECT_THROW(c->iall_to_all_v(s, {2}, {0}, r, {3}, {0}, Elem::I64), ValueError);
}

// One rank, several chunks, an expert with no rows: the exchange must reproduce grouped_ffn.
TEST(ExpertParallel, ChunkedExchangeOnOneRankEqualsGroupedFfn) {
  Context ctx(ContextOptions{.threads = 1});
  Rng rng(test::test_seed());
  const int64_t E = 4, l = 5, F = 3, N = 11;
  const int32_t counts[E] = {4, 0, 6, 1};
  ops::GroupedFfnParams p{.rows = N, .experts = E, .in = l, .ffn = F};
  auto randn = [&](Shape s) {
    Tensor t = Tensor::empty(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = rng.normal() * 0.5f;
    return t;
  };
  ops::GroupedFfnWeights w{.gate_up = randn({E, 2 * F, l}), .down = randn({E, l, F})};
  Tensor x = randn({N, l}), dy = randn({N, l});
  Tensor off = Tensor::empty({E + 1}, DType::I32);
  off.i32()[0] = 0;
  for (int64_t e = 0; e < E; ++e) off.i32()[e + 1] = off.i32()[e] + counts[e];

  ArenaPlan plan;
  ops::grouped_ffn_plan(p, plan);
  Arena arena(plan.bytes(), Device::CPU, "test");
  ops::GroupedFfnSaved saved = ops::grouped_ffn_alloc_saved(p, arena);
  Tensor y_ref = Tensor::empty({N, l}), dx_ref = Tensor::empty({N, l});
  ops::GroupedFfnWeights g_ref{.gate_up = Tensor::zeros({E, 2 * F, l}),
                               .down = Tensor::zeros({E, l, F})};
  ops::grouped_ffn_forward(ctx, p, x, off, w, y_ref, saved);
  ops::grouped_ffn_backward(ctx, p, x, off, w, saved, dy, dx_ref, g_ref);

  auto comm = make_local_comm();
  for (int chunks : {1, 3, 20}) {
    ExpertParallel ep(*comm, E, {.chunks = chunks});
    Tensor y = Tensor::empty({N, l}), dx = Tensor::empty({N, l});
    ops::GroupedFfnWeights g{.gate_up = Tensor::zeros({E, 2 * F, l}),
                             .down = Tensor::zeros({E, l, F})};
    const std::unique_ptr<ExpertState> st = ep.make_state();
    ep.forward(ctx, p, x, off, w, y, *st);
    ep.backward(ctx, p, w, dy, dx, g, *st);
    EXPECT_EQ(ep.rows_received(), N);
    auto near = [&](const Tensor& a, const Tensor& b, const char* what) {
      for (int64_t i = 0; i < a.numel(); ++i)
        ASSERT_NEAR(a.f32()[i], b.f32()[i], 1e-5 * (1 + std::abs(b.f32()[i])))
            << what << " [" << i << "], chunks " << chunks;
    };
    near(y, y_ref, "y");
    near(dx, dx_ref, "dx");
    near(g.gate_up, g_ref.gate_up, "dW_gate_up");
    near(g.down, g_ref.down, "dW_down");
  }
}

}  // namespace
}  // namespace mt::par
