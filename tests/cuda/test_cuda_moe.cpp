// The MoE op families on the GPU against the CPU engine, through harness/gpu_check.h: router
// (scores, group-limited top-k, weights, seq aux and z losses, their backwards, load counts),
// dispatch (plan, gather, combine and backwards) and overflow rerouting; grouped matmul and the
// grouped SwiGLU experts are in test_cuda_grouped.cpp. Integer results (ids, plans, counts,
// rerouting statistics) must match the CPU exactly; they are compared as numbers by run_case and
// element by element here. Without a GPU every test skips, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/seq_info.h"
#include "harness/gpu_check.h"
#include "ops/expert_load.h"
#include "ops/moe_dispatch.h"
#include "ops/overflow_route.h"
#include "ops/router.h"

namespace mt::test {
namespace {

// An integer result as an f32 host tensor (run_case compares float tensors); `keep` collects the
// raw values for the exact comparison.
Tensor ints_as_f32(Context& c, const Tensor& t, std::vector<std::vector<int64_t>>* keep) {
  c.synchronize();
  const Tensor h = t.to(Device::CPU);
  Tensor f = Tensor::empty(t.shape());
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[i] = t.dtype() == DType::I64 ? h.i64()[i] : h.i32()[i];
    f.f32()[i] = static_cast<float>(v[i]);
  }
  if (keep) keep->push_back(std::move(v));
  return f;
}

Tensor scalar(double v) {
  Tensor t = Tensor::empty({1});
  t.f32()[0] = static_cast<float>(v);
  return t;
}

// A poisoned integer buffer on the context's device.
Tensor int_out(Context& c, const Shape& s, DType dt = DType::I32) {
  Tensor h = Tensor::empty(s, dt);
  for (int64_t i = 0; i < h.numel(); ++i) {
    if (dt == DType::I64)
      h.i64()[i] = -7;
    else
      h.i32()[i] = -7;
  }
  return like(c, h);
}

// Every GPU run's integers equal the CPU's (the first CPU run is the reference).
void expect_same_ints(const std::vector<std::vector<int64_t>>& cpu,
                      const std::vector<std::vector<int64_t>>& gpu, const char* what) {
  ASSERT_FALSE(cpu.empty());
  ASSERT_FALSE(gpu.empty());
  const size_t per_run = gpu.size() / 2;  // the f32 and the bf16 pass
  for (size_t i = 0; i < gpu.size(); ++i) {
    const std::vector<int64_t>& want = cpu[i % per_run];
    ASSERT_EQ(gpu[i].size(), want.size());
    size_t bad = 0;
    for (size_t j = 0; j < want.size(); ++j) bad += gpu[i][j] != want[j];
    EXPECT_EQ(bad, 0u) << what << " result " << i << " differs from the CPU in " << bad
                       << " places";
  }
}

// The selection score of expert e of token t as the router forms it (double; for redraws only).
std::vector<double> selection(const ops::RouterParams& p, const float* l, const float* b) {
  const int64_t E = p.experts;
  std::vector<double> s(static_cast<size_t>(E));
  double mx = -1e300, sum = 0;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
  for (int64_t e = 0; e < E; ++e) {
    s[e] = p.score == ops::ScoreFunc::Softmax ? std::exp(l[e] - mx) : 1.0 / (1.0 + std::exp(-l[e]));
    sum += s[e];
  }
  for (int64_t e = 0; e < E; ++e) {
    if (p.score == ops::ScoreFunc::Softmax) s[e] /= sum;
    s[e] += b ? b[e] : 0.0;
  }
  return s;
}

// The descending values of v at `idx` have gaps above `gap` up to position n (their order and
// the boundary after the first n).
bool separated(const std::vector<double>& v, std::vector<int64_t> idx, int64_t n, double gap) {
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  for (int64_t j = 0; j < n && j + 1 < static_cast<int64_t>(idx.size()); ++j)
    if (v[idx[j]] - v[idx[j + 1]] < gap) return false;
  return true;
}

// True when the token's selection has no near-ties where they matter: among the kept groups and
// the first group left out, and among the chosen experts and the first one left out. Then fp32 on
// either device selects the same experts in the same order.
bool well_separated(const ops::RouterParams& p, const std::vector<double>& sel, double gap) {
  const int64_t E = p.experts, G = p.n_group, gs = E / G;
  std::vector<int64_t> cand;
  if (G > 1) {
    std::vector<double> gsc(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> m(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
      std::sort(m.rbegin(), m.rend());
      gsc[g] = p.score == ops::ScoreFunc::Sigmoid && gs >= 2 ? m[0] + m[1] : m[0];
    }
    std::vector<int64_t> groups(static_cast<size_t>(G));
    std::iota(groups.begin(), groups.end(), 0);
    if (!separated(gsc, groups, p.topk_group, gap)) return false;
    std::sort(groups.begin(), groups.end(), [&](int64_t a, int64_t b) { return gsc[a] > gsc[b]; });
    for (int64_t j = 0; j < p.topk_group; ++j)
      for (int64_t i = 0; i < gs; ++i) cand.push_back(groups[j] * gs + i);
  } else {
    cand.resize(static_cast<size_t>(E));
    std::iota(cand.begin(), cand.end(), 0);
  }
  return separated(sel, cand, p.top_k, gap);
}

// Random logits whose tokens have no near-ties (a near-tie could select differently on the two
// devices, by one ulp; exact ties are tested on their own below).
Tensor router_logits(Rng& rng, const ops::RouterParams& p, const Tensor& bias, double scale) {
  const int64_t T = p.tokens, E = p.experts;
  Tensor l = randn(rng, {T, E}, scale);
  const float* b = bias.defined() ? bias.f32() : nullptr;
  for (int64_t t = 0; t < T; ++t) {
    float* row = l.f32() + t * E;
    for (int tries = 0; !well_separated(p, selection(p, row, b), 1e-5); ++tries) {
      if (tries == 1000) {
        ADD_FAILURE() << "no well-separated draw of token " << t;
        break;
      }
      for (int64_t e = 0; e < E; ++e) row[e] = static_cast<float>(scale * rng.normal());
    }
  }
  return l;
}

struct RouterSetup {
  ops::RouterParams p;
  bool bias = false;
  std::vector<int64_t> docs;
};

void router_check(const char* name, const RouterSetup& s) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const ops::RouterParams& p = s.p;
  const int64_t T = p.tokens, E = p.experts, K = p.top_k;
  const SeqInfo seq = SeqInfo::from_lengths(s.docs);
  Tensor bias = s.bias ? randn(rng, {E}, 0.1) : Tensor();
  Tensor logits = router_logits(rng, p, bias, 1.5);
  std::vector<In> ins = {
      {logits, false}, {s.bias ? bias : Tensor::zeros({E}), false}, {randn(rng, {T, K}), false}};
  std::vector<std::vector<int64_t>> cpu_ints, gpu_ints;
  run_case(
      name, ins, {"scores", "ids", "weights", "seq_aux", "z_loss", "dlogits", "counts"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor scores = out(c, {T, E}, DType::F32), w = out(c, {T, K}, DType::F32);
        Tensor ids = int_out(c, {T, K});
        const Tensor b = s.bias ? in[1] : Tensor();
        OP(router_forward)(c, p, in[0], b, scores, ids, w);
        Tensor aux = Tensor::empty({1}, DType::F64, c.device());
        Tensor z = Tensor::empty({1}, DType::F64, c.device());
        OP(router_seq_aux_loss)(c, p, seq, scores, ids, aux);
        OP(router_z_loss)(c, p, in[0], z);
        Tensor dl = out(c, {T, E}, DType::F32);
        OP(router_backward)(c, p, scores, ids, in[2], dl);
        OP(router_seq_aux_backward)(c, p, seq, scores, ids, 0.7f, dl);
        OP(router_z_loss_backward)(c, p, in[0], 0.3f, dl);
        Tensor counts = int_out(c, {E}, DType::I64);
        OP(expert_load_counts)(c, ids, E, counts);
        auto* keep = gpu ? &gpu_ints : &cpu_ints;
        Tensor fid = ints_as_f32(c, ids, keep), fcnt = ints_as_f32(c, counts, keep);
        c.synchronize();
        return {scores, fid, w, scalar(read_scalar(aux)), scalar(read_scalar(z)), dl, fcnt};
      },
      seed);
  expect_same_ints(cpu_ints, gpu_ints, name);
}

TEST(CudaRouter, SigmoidSoftmaxAndGroupLimitedAtTheCpuTestSizes) {
  REQUIRE_GPU();
  router_check("router sigmoid", {.p = {.tokens = 37, .experts = 8, .top_k = 2}, .docs = {37}});
  router_check("router softmax unnormalised", {.p = {.tokens = 29,
                                                     .experts = 7,
                                                     .top_k = 3,
                                                     .score = ops::ScoreFunc::Softmax,
                                                     .norm_topk_prob = false,
                                                     .routed_scaling = 1.7f},
                                               .docs = {29}});
  router_check("router sigmoid groups bias", {.p = {.tokens = 41,
                                                    .experts = 16,
                                                    .top_k = 3,
                                                    .n_group = 4,
                                                    .topk_group = 2,
                                                    .routed_scaling = 2.5f},
                                              .bias = true,
                                              .docs = {7, 1, 15, 18}});
  router_check("router softmax groups", {.p = {.tokens = 33,
                                               .experts = 12,
                                               .top_k = 2,
                                               .score = ops::ScoreFunc::Softmax,
                                               .n_group = 4,
                                               .topk_group = 2},
                                         .docs = {13, 20}});
  router_check("router k fills kept groups",
               {.p = {.tokens = 19, .experts = 8, .top_k = 4, .n_group = 4, .topk_group = 2},
                .bias = true,
                .docs = {19}});
}

TEST(CudaRouter, LargeGroupLimitedTop8) {
  REQUIRE_GPU();
  router_check("router 2048x64 top-8 groups 8/4", {.p = {.tokens = 2048,
                                                         .experts = 64,
                                                         .top_k = 8,
                                                         .n_group = 8,
                                                         .topk_group = 4,
                                                         .routed_scaling = 2.5f},
                                                   .bias = true,
                                                   .docs = {700, 1, 300, 1047}});
  router_check("router 2048x384 softmax top-8",
               {.p = {.tokens = 2048, .experts = 384, .top_k = 8, .score = ops::ScoreFunc::Softmax},
                .docs = {2048}});
  // Documents on and off the 64-token chunks the per-document statistics sum over
  // (ops/cuda/router.cu): starting and ending on a chunk edge, one token, one short of a chunk.
  router_check("router 2048x256 sigmoid top-8 chunk edges",
               {.p = {.tokens = 2048, .experts = 256, .top_k = 8}, .docs = {64, 128, 1, 63, 1792}});
}

// Exact ties everywhere (logits from three values): experts and groups go to the lower index on
// both devices, so the ids agree exactly.
TEST(CudaRouter, TiesGoToTheLowerIndexLikeTheCpu) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  for (ops::ScoreFunc f : {ops::ScoreFunc::Sigmoid, ops::ScoreFunc::Softmax}) {
    const ops::RouterParams p{
        .tokens = 300, .experts = 32, .top_k = 6, .score = f, .n_group = 8, .topk_group = 3};
    Tensor logits = Tensor::empty({p.tokens, p.experts});
    for (int64_t i = 0; i < logits.numel(); ++i)
      logits.f32()[i] = 0.5f * static_cast<float>(static_cast<int64_t>(rng.below(3)) - 1);
    Context cpu, gpu(ContextOptions{.device = Device::CUDA});
    Tensor s = Tensor::empty({p.tokens, p.experts}), w = Tensor::empty({p.tokens, p.top_k});
    Tensor ids = Tensor::empty({p.tokens, p.top_k}, DType::I32);
    ops::router_forward(cpu, p, logits, Tensor(), s, ids, w);
    Tensor dl = logits.to(Device::CUDA), ds = Tensor::empty(s.shape(), DType::F32, Device::CUDA);
    Tensor dw = Tensor::empty(w.shape(), DType::F32, Device::CUDA);
    Tensor dids = Tensor::empty(ids.shape(), DType::I32, Device::CUDA);
    ops::router_forward(gpu, p, dl, Tensor(), ds, dids, dw);
    gpu.synchronize();
    const Tensor got = dids.to(Device::CPU);
    int64_t bad = 0;
    for (int64_t i = 0; i < ids.numel(); ++i) bad += got.i32()[i] != ids.i32()[i];
    EXPECT_EQ(bad, 0) << (f == ops::ScoreFunc::Sigmoid ? "sigmoid" : "softmax");
  }
}

TEST(CudaRouter, BiasUpdateAndMappedLoads) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t E = 64, S = 96;
  Tensor load = Tensor::empty({E}, DType::I64);
  for (int64_t e = 0; e < E; ++e) load.i64()[e] = static_cast<int64_t>(rng.below(40));
  Tensor off = Tensor::empty({S + 1}, DType::I32), at = Tensor::empty({S}, DType::I32);
  off.i32()[0] = 0;
  for (int64_t s = 0; s < S; ++s) {
    off.i32()[s + 1] = off.i32()[s] + static_cast<int32_t>(rng.below(9));
    at.i32()[s] = static_cast<int32_t>(rng.below(E));
  }
  Tensor table = Tensor::empty({E}, DType::I32);
  std::iota(table.i32(), table.i32() + E, 0);
  for (int64_t e = E - 1; e > 0; --e) std::swap(table.i32()[e], table.i32()[rng.below(e + 1)]);
  std::vector<In> ins = {
      {load, false}, {randn(rng, {E}, 0.1), false}, {off, false}, {at, false}, {table, false}};
  std::vector<std::vector<int64_t>> cpu_ints, gpu_ints;
  run_case(
      "bias update, load count, map ids", ins, {"bias", "load", "mapped"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor b = like(c, in[1]);
        OP(router_bias_update)(c, in[0], 0.01f, b);
        Tensor l = like(c, in[0]);  // accumulates onto the loads
        OP(expert_load_count)(c, in[2], in[3], l);
        Tensor ids = like(c, in[3]);
        OP(map_ids)(c, ids, in[4]);
        auto* keep = gpu ? &gpu_ints : &cpu_ints;
        Tensor fl = ints_as_f32(c, l, keep), fm = ints_as_f32(c, ids, keep);
        return {b, fl, fm};
      },
      seed);
  expect_same_ints(cpu_ints, gpu_ints, "loads and mapped ids");
}

// Dispatch: plan, gather (+ backward, written and accumulated), combine (+ backward). With `pad`,
// the GPU's gathered rows and row gradients are the first W columns of [T*K, W + pad] buffers
// (the K-concatenated expert LoRA's padded rows, ops/grouped_ffn.h).
void dispatch_check(const char* name, int64_t T, int64_t E, int64_t K, int64_t W, int64_t pad = 0) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  Tensor ids = Tensor::empty({T, K}, DType::I32);
  for (int64_t t = 0; t < T; ++t) {
    // k distinct experts, none from every third one (so some experts receive nothing).
    std::vector<int32_t> pool;
    for (int32_t e = 0; e < E; ++e)
      if (e % 3 != 1 || E < 3) pool.push_back(e);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t pick = j + rng.below(static_cast<int64_t>(pool.size()) - j);
      std::swap(pool[j], pool[pick]);
      ids.i32()[t * K + j] = pool[j];
    }
  }
  std::vector<In> ins = {{randn(rng, {T, W})},     {ids, false},
                         {randn(rng, {T * K, W})}, {randn(rng, {T, K}), false},
                         {randn(rng, {T, W})},     {randn(rng, {T * K, W})},
                         {randn(rng, {T, W})}};
  std::vector<std::vector<int64_t>> cpu_ints, gpu_ints;
  run_case(
      name, ins, {"perm", "inv", "offsets", "rows", "y", "dx", "dx_acc", "drows", "dweights"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType at = in[0].dtype();
        Tensor perm = int_out(c, {T * K}), inv = int_out(c, {T * K}), off = int_out(c, {E + 1});
        OP(moe_dispatch_plan)(c, in[1], E, perm, inv, off);
        const int64_t pitch = W + (gpu ? pad : 0);
        Tensor rows = out(c, {T * K, pitch}, at).cols(0, W), y = out(c, {T, W}, at);
        OP(moe_gather)(c, in[0], perm, K, rows);
        OP(moe_combine)(c, in[2], in[3], inv, y);
        Tensor dx = out(c, {T, W}, at), dxa = like(c, in[6]);
        OP(moe_gather_backward)(c, in[5], inv, K, dx, false);
        OP(moe_gather_backward)(c, in[5], inv, K, dxa, true);
        Tensor dr = out(c, {T * K, pitch}, at).cols(0, W), dw = out(c, {T, K}, DType::F32);
        OP(moe_combine_backward)(c, in[2], in[3], inv, in[4], dr, dw);
        auto* keep = gpu ? &gpu_ints : &cpu_ints;
        Tensor fp = ints_as_f32(c, perm, keep), fi = ints_as_f32(c, inv, keep),
               fo = ints_as_f32(c, off, keep);
        return {fp, fi, fo, rows.clone(), y, dx, dxa, dr.clone(), dw};
      },
      seed);
  expect_same_ints(cpu_ints, gpu_ints, name);
}

TEST(CudaDispatch, PlanGatherCombineForwardBackward) {
  REQUIRE_GPU();
  dispatch_check("dispatch zero-token experts", 5, 8, 2, 13);
  dispatch_check("dispatch odd sizes", 37, 11, 3, 19);
  dispatch_check("dispatch top-1", 17, 4, 1, 7);
  dispatch_check("dispatch 2048x64 top-8", 2048, 64, 8, 256);
  dispatch_check("dispatch 3000x384 top-8", 3000, 384, 8, 64);
  dispatch_check("dispatch pitched rows, packs", 300, 16, 8, 64, 16);
  dispatch_check("dispatch pitched rows, elements", 37, 11, 3, 19, 5);
}

// Overflow rerouting on scores and candidates that both devices get as inputs (the router's
// CPU output), so the assignment must agree exactly; backward through the router's.
void overflow_check(const char* name, int64_t T, int64_t E, int64_t K, int64_t M, int64_t P,
                    bool softmax) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  ops::RouterParams cp{.tokens = T,
                       .experts = E,
                       .top_k = K + M,
                       .score = softmax ? ops::ScoreFunc::Softmax : ops::ScoreFunc::Sigmoid};
  Tensor logits = randn(rng, {T, E});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < 2; ++e) logits.f32()[t * E + e] += 1.5f;  // hot experts: capacity binds
  Tensor bias = randn(rng, {E}, 0.05);
  Context cpu;
  Tensor scores = Tensor::empty({T, E}), cand = Tensor::empty({T, K + M}, DType::I32);
  Tensor cw = Tensor::empty({T, K + M});
  ops::router_forward(cpu, cp, logits, bias, scores, cand, cw);
  const ops::OverflowParams op{.tokens = T,
                               .experts = E,
                               .top_k = K,
                               .extra = M,
                               .expert_capacity = 1.0f,
                               .rank_capacity = 1.05f,
                               .max_reroute_share = 0.5f};
  ops::RouterParams rp = cp;
  rp.top_k = K;
  const std::vector<int32_t> ranks = ops::contiguous_expert_ranks(E, P);
  std::vector<In> ins = {
      {scores, false}, {bias, false}, {cand, false}, {randn(rng, {T, K}), false}};
  std::vector<std::vector<int64_t>> cpu_ints, gpu_ints;
  run_case(
      name, ins, {"ids", "weights", "dlogits"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor ids = int_out(c, {T, K}), w = out(c, {T, K}, DType::F32);
        const ops::OverflowStats st =
            OP(overflow_route_forward)(c, op, rp, ranks, in[0], in[1], in[2], ids, w);
        Tensor dl = out(c, {T, E}, DType::F32);
        OP(router_backward)(c, rp, in[0], ids, in[3], dl);
        auto* keep = gpu ? &gpu_ints : &cpu_ints;
        keep->push_back({st.pairs, st.shed, st.rerouted, st.over_capacity, st.expert_cap,
                         st.rank_cap, st.max_expert_before, st.max_expert_after, st.max_rank_before,
                         st.max_rank_after});
        Tensor fi = ints_as_f32(c, ids, keep);
        return {fi, w, dl};
      },
      seed);
  expect_same_ints(cpu_ints, gpu_ints, name);
  ASSERT_FALSE(cpu_ints.empty());
  EXPECT_GT(cpu_ints[0][2], 0) << "the case must exercise rerouting";
}

TEST(CudaOverflowRoute, ReroutesLikeTheCpuWithItsBackward) {
  REQUIRE_GPU();
  overflow_check("overflow sigmoid", 16, 10, 3, 3, 2, false);
  overflow_check("overflow softmax", 16, 10, 3, 3, 2, true);
  overflow_check("overflow 2048x64 top-8", 2048, 64, 8, 4, 8, false);
}

}  // namespace
}  // namespace mt::test
