// OpGraph on a CPU context (core/graph.h): capture keeps the function without running it, each
// replay runs it on whatever the buffers hold then, and the replay's checks (a capture first, the
// capture's context, a workspace no fuller than at capture) hold. The CUDA side is
// tests/cuda/test_cuda_graph.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <utility>

#include "core/arena.h"
#include "core/context.h"
#include "core/graph.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "harness/seed.h"
#include "ops/elementwise.h"

namespace mt {
namespace {

TEST(OpGraph, CpuCaptureRunsNothingAndEachReplayRunsTheOps) {
  Context ctx;
  int runs = 0;
  OpGraph g;
  EXPECT_FALSE(g.captured());
  g.capture(ctx, [&] { ++runs; });
  EXPECT_TRUE(g.captured());
  EXPECT_EQ(runs, 0);
  for (int i = 1; i <= 3; ++i) {
    g.replay(ctx);
    EXPECT_EQ(runs, i);
  }
  EXPECT_EQ(g.nodes().total(), 0);  // no CUDA graph on the CPU
}

// Fresh inputs written into the captured buffers between replays: each replay's output is the
// op on the values present then (reference: a double-precision loop).
TEST(OpGraph, CpuReplayReadsTheBuffersAsTheyAreThen) {
  const uint64_t seed = test::test_seed();
  Rng rng(seed);
  Context ctx;
  const int64_t n = 257;
  const float s = -1.75f;
  Tensor x = Tensor::empty({n}), y = Tensor::empty({n});
  OpGraph g;
  g.capture(ctx, [&] { ops::scale(ctx, x, s, y); });
  for (int round = 0; round < 3; ++round) {
    for (int64_t i = 0; i < n; ++i) {
      x.f32()[i] = static_cast<float>(rng.normal());
      y.f32()[i] = 1e30f;  // a replay that skipped y would leave this
    }
    g.replay(ctx);
    for (int64_t i = 0; i < n; ++i) {
      const double want = static_cast<double>(s) * static_cast<double>(x.f32()[i]);
      ASSERT_NEAR(y.f32()[i], want, 1e-6 * (1 + std::abs(want)))
          << "round " << round << ", element " << i << "; " << test::seed_note();
    }
  }
}

TEST(OpGraph, ReplayChecksCaptureContextAndWorkspace) {
  Context ctx, other;
  OpGraph g;
  EXPECT_THROW(g.replay(ctx), InternalError);
  int runs = 0;
  {
    // Captured with 1 KiB of the workspace in use: a replay may find as much in use, or less.
    ArenaScope outer(ctx.workspace());
    (void)ctx.workspace().alloc({256});
    g.capture(ctx, [&] { ++runs; });
    g.replay(ctx);
    ArenaScope inner(ctx.workspace());
    (void)ctx.workspace().alloc({16});
    EXPECT_THROW(g.replay(ctx), ValueError);  // scratch would overlap a live tensor
  }
  g.replay(ctx);
  EXPECT_THROW(g.replay(other), ValueError);
  EXPECT_EQ(runs, 2);
  EXPECT_THROW(g.capture(ctx, std::function<void()>()), ValueError);
  EXPECT_FALSE(g.captured());  // a failed capture leaves nothing
}

TEST(OpGraph, MoveRecaptureAndReset) {
  Context ctx;
  int a = 0, b = 0;
  OpGraph g;
  g.capture(ctx, [&] { ++a; });
  OpGraph h(std::move(g));
  EXPECT_FALSE(g.captured());  // NOLINT(bugprone-use-after-move): moved-from is empty
  h.replay(ctx);
  EXPECT_EQ(a, 1);
  h.capture(ctx, [&] { ++b; });  // replaces the first capture
  h.replay(ctx);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 1);
  OpGraph k;
  k = std::move(h);
  k.replay(ctx);
  EXPECT_EQ(b, 2);
  k.reset();
  EXPECT_FALSE(k.captured());
  EXPECT_THROW(k.replay(ctx), InternalError);
}

}  // namespace
}  // namespace mt
