// CUDA graphs (core/graph.h) over the routed experts' grouped SwiGLU FFN, the ops `moetrain bench
// moe` replays: a forward+backward captured once and replayed on fresh inputs written into the
// captured buffers gives, bit for bit, what the same ops give run eagerly on those inputs. Exact
// equality is the expectation, not a tolerance: a replay launches the same kernels with the same
// parameters on the same addresses, and every kernel of this path is deterministic under a
// deterministic context (the LoRA weight-gradient kernels' f32 atomics are off there; CUTLASS's
// grouped kernels split no reduction across blocks). The eager path itself is checked against
// the CPU engine in test_cuda_grouped.cpp; here it is the reference for the replay. Outputs are
// poisoned with NaN before each run and gradients pre-filled with fresh values, so a replay that
// skipped a write or overwrote an accumulation shows. Without a GPU the tests skip.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/graph.h"
#include "harness/gpu_check.h"
#include "harness/seed.h"
#include "ops/grouped_ffn.h"

namespace mt::test {
namespace {

enum class Train { Frozen, Full, Lora };

const char* train_name(Train t) {
  return t == Train::Frozen ? "frozen base (dX only)"
         : t == Train::Full ? "training base (dX + dW)"
                            : "LoRA rank 16 (dX + adapter grads)";
}

void poison(Tensor& t) {
  Tensor h = Tensor::empty(t.shape());
  for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] = std::numeric_limits<float>::quiet_NaN();
  t.copy_from(h);
}

// The device buffers of one grouped FFN forward+backward (bf16 activations and weights, f32
// gradients; the shapes take CUTLASS's grouped kernels and the skinny LoRA kernels), with
// offsets over 8 experts that include a hot one, an empty one and one of a single row.
struct Ffn {
  static constexpr int64_t N = 1000, E = 8, in = 256, F = 128, r = 16;
  ops::GroupedFfnParams p;
  Tensor off;
  Tensor x, dy, y, dx;
  ops::GroupedFfnWeights w, g;
  Arena arena;
  ops::GroupedFfnSaved saved;

  explicit Ffn(Train train) {
    const Device D = Device::CUDA;
    const DType bf = DType::BF16, f32 = DType::F32;
    p = {.rows = N, .experts = E, .in = in, .ffn = F};
    if (train == Train::Lora) {
      p.lora_rank = r;
      p.lora_alpha = 32.f;
    }
    off = Tensor::empty({E + 1}, DType::I32);
    const int32_t counts[E] = {500, 90, 120, 0, 70, 1, 119, 100};
    off.i32()[0] = 0;
    for (int64_t e = 0; e < E; ++e) off.i32()[e + 1] = off.i32()[e] + counts[e];
    MT_CHECK(off.i32()[E] == N, InternalError, "test offsets sum to ", off.i32()[E]);
    x = Tensor::empty({N, in}, bf, D);
    dy = Tensor::empty({N, in}, bf, D);
    y = Tensor::empty({N, in}, bf, D);
    dx = Tensor::empty({N, in}, bf, D);
    w.gate_up = Tensor::empty({E, 2 * F, in}, bf, D);
    w.down = Tensor::empty({E, in, F}, bf, D);
    if (train == Train::Full) {
      g.gate_up = Tensor::empty({E, 2 * F, in}, f32, D);
      g.down = Tensor::empty({E, in, F}, f32, D);
    }
    if (train == Train::Lora) {
      w.gate_up_a = Tensor::empty({E, r, in}, bf, D);
      w.gate_up_b = Tensor::empty({E, 2 * F, r}, bf, D);
      w.down_a = Tensor::empty({E, r, F}, bf, D);
      w.down_b = Tensor::empty({E, in, r}, bf, D);
      for (auto [gt, wt] : {std::pair{&g.gate_up_a, &w.gate_up_a},
                            {&g.gate_up_b, &w.gate_up_b},
                            {&g.down_a, &w.down_a},
                            {&g.down_b, &w.down_b}})
        *gt = Tensor::empty(wt->shape(), f32, D);
    }
    ArenaPlan plan(bf, D);
    ops::grouped_ffn_plan(p, plan);
    arena = Arena(plan.bytes(), D, "test graph saved");
    saved = ops::grouped_ffn_alloc_saved(p, arena, bf);
  }

  void run(Context& ctx) {
    ops::grouped_ffn_forward(ctx, p, x, off, w, y, saved);
    ops::grouped_ffn_backward(ctx, p, x, off, w, saved, dy, dx, g);
  }

  std::vector<std::pair<std::string, Tensor*>> inputs() {
    std::vector<std::pair<std::string, Tensor*>> v = {
        {"x", &x}, {"dy", &dy}, {"gate_up", &w.gate_up}, {"down", &w.down}};
    for (auto [name, t] : {std::pair{"gate_up_a", &w.gate_up_a},
                           {"gate_up_b", &w.gate_up_b},
                           {"down_a", &w.down_a},
                           {"down_b", &w.down_b}})
      if (t->defined()) v.emplace_back(name, t);
    return v;
  }
  std::vector<std::pair<std::string, Tensor*>> grads() {
    std::vector<std::pair<std::string, Tensor*>> v;
    for (auto [name, t] : {std::pair{"dgate_up", &g.gate_up},
                           {"ddown", &g.down},
                           {"dgate_up_a", &g.gate_up_a},
                           {"dgate_up_b", &g.gate_up_b},
                           {"ddown_a", &g.down_a},
                           {"ddown_b", &g.down_b}})
      if (t->defined()) v.emplace_back(name, t);
    return v;
  }
  // Everything a run writes: outputs, what forward saves, accumulated gradients.
  std::vector<std::pair<std::string, Tensor*>> results() {
    std::vector<std::pair<std::string, Tensor*>> v = {
        {"y", &y}, {"dx", &dx}, {"saved gate_up", &saved.gate_up}};
    if (saved.xa.defined()) v.emplace_back("saved xa", &saved.xa);
    if (saved.ha.defined()) v.emplace_back("saved ha", &saved.ha);
    for (auto& gr : grads()) v.push_back(gr);
    return v;
  }
};

// Fresh host values for the inputs and the gradients' pre-fill.
struct Draw {
  std::vector<Tensor> inputs, grads;
  Draw(Ffn& f, Rng& rng) {
    for (auto& [name, t] : f.inputs())
      inputs.push_back(randn(rng, t->shape(), name == "x" || name == "dy" ? 1.0 : 0.06));
    for (auto& [name, t] : f.grads()) grads.push_back(randn(rng, t->shape(), 0.1));
  }
  // Writes them into the buffers (copies on the legacy stream, ordered with the context's) and
  // poisons every other result.
  void load(Ffn& f) const {
    auto in = f.inputs();
    for (size_t i = 0; i < in.size(); ++i) in[i].second->copy_from(inputs[i]);
    auto gr = f.grads();
    for (size_t i = 0; i < gr.size(); ++i) gr[i].second->copy_from(grads[i]);
    for (Tensor* t : {&f.y, &f.dx, &f.saved.gate_up, &f.saved.xa, &f.saved.ha})
      if (t->defined()) poison(*t);
  }
};

std::vector<std::vector<uint8_t>> snapshot(Context& ctx, Ffn& f) {
  ctx.synchronize();
  std::vector<std::vector<uint8_t>> v;
  for (auto& [name, t] : f.results()) v.push_back(host_bytes(*t));
  return v;
}

// Bit equality of every result, naming the first element that differs.
void expect_same(Ffn& f, const std::vector<std::vector<uint8_t>>& got,
                 const std::vector<std::vector<uint8_t>>& want, const std::string& what) {
  const auto names = f.results();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << names[i].first;
    if (std::memcmp(got[i].data(), want[i].data(), got[i].size()) == 0) continue;
    size_t b = 0;
    while (got[i][b] == want[i][b]) ++b;
    const size_t el = b / dtype_size(names[i].second->dtype());
    ADD_FAILURE() << what << ": " << names[i].first << " differs from the eager run at element "
                  << el << "; " << seed_note();
  }
}

void replay_matches_eager(Train train) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  Context ctx({.device = Device::CUDA, .workspace_bytes = size_t(64) << 20, .deterministic = true});
  Ffn f(train);
  // Captured on the first draw's buffers; capture runs nothing.
  Draw(f, rng).load(f);
  OpGraph graph;
  graph.capture(ctx, [&] { f.run(ctx); });
  ASSERT_TRUE(graph.captured());
  EXPECT_GT(graph.nodes().kernels, 3) << train_name(train);
  std::vector<uint8_t> first_y;
  for (int round = 0; round < 3; ++round) {
    const Draw d(f, rng);
    d.load(f);
    graph.replay(ctx);
    const auto replayed = snapshot(ctx, f);
    d.load(f);
    f.run(ctx);
    const auto eager = snapshot(ctx, f);
    expect_same(f, replayed, eager,
                std::string(train_name(train)) + ", round " + std::to_string(round));
    // The replay read this round's inputs, not the capture's or the last round's.
    if (round == 0)
      first_y = replayed[0];
    else
      EXPECT_TRUE(replayed[0] != first_y) << "y of round " << round << " equals round 0's";
  }
}

TEST(CudaGraph, GroupedFfnFrozenReplayEqualsEager) {
  REQUIRE_GPU();
  replay_matches_eager(Train::Frozen);
}

TEST(CudaGraph, GroupedFfnFullReplayEqualsEager) {
  REQUIRE_GPU();
  replay_matches_eager(Train::Full);
}

TEST(CudaGraph, GroupedFfnLoraReplayEqualsEager) {
  REQUIRE_GPU();
  replay_matches_eager(Train::Lora);
}

// An op that waits for the device or copies to the host inside a capture fails it with an error,
// leaves no graph, and leaves the context usable: the next capture of the grouped FFN replays as
// its eager run.
TEST(CudaGraph, CaptureOfAWaitOrAHostCopyFailsCleanly) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  Context ctx({.device = Device::CUDA, .workspace_bytes = size_t(64) << 20, .deterministic = true});
  Ffn f(Train::Frozen);
  const Draw d(f, rng);
  d.load(f);
  OpGraph graph;
  EXPECT_THROW(graph.capture(ctx,
                             [&] {
                               f.run(ctx);
                               ctx.synchronize();
                             }),
               Error);
  EXPECT_FALSE(graph.captured());
  EXPECT_THROW(graph.capture(ctx,
                             [&] {
                               f.run(ctx);
                               (void)f.y.to(Device::CPU);
                             }),
               Error);
  EXPECT_FALSE(graph.captured());
  graph.capture(ctx, [&] { f.run(ctx); });
  d.load(f);
  graph.replay(ctx);
  const auto replayed = snapshot(ctx, f);
  d.load(f);
  f.run(ctx);
  expect_same(f, replayed, snapshot(ctx, f), "after two failed captures");
}

}  // namespace
}  // namespace mt::test
