// Bounded overflow rerouting: guarantees on random skewed routings, an independent reference of
// the assignment, and the gate-weight backward against finite differences of a double reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/rng.h"
#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/overflow_route.h"

namespace mt {
namespace {

using test::DVec;

// Candidate lists drawn from a skewed popularity (expert e weighs (e+1)^-1.2: low ids are hot).
void draw_candidates(Rng& rng, int64_t T, int64_t E, int64_t W, std::vector<int32_t>& cand,
                     std::vector<float>& prio) {
  cand.assign(static_cast<size_t>(T * W), 0);
  prio.assign(cand.size(), 0.f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> key(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      key[e] = std::log(rng.uniform() + 1e-300) / std::pow(static_cast<double>(e + 1), -1.2);
    std::vector<int32_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return key[a] > key[b]; });
    for (int64_t j = 0; j < W; ++j) {
      cand[t * W + j] = idx[j];
      prio[t * W + j] = static_cast<float>(1.0 / (1.0 - key[idx[j]]));  // descending in j
    }
  }
}

// Independent reference of the assignment: full sorts and explicit loops, no nth_element.
std::vector<int32_t> ref_assign(const ops::OverflowParams& p, const std::vector<int32_t>& cand,
                                const std::vector<float>& prio, const std::vector<int32_t>& rank) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k, W = K + p.extra;
  int64_t P = *std::max_element(rank.begin(), rank.end()) + 1;
  const double pairs = static_cast<double>(T * K);
  const int64_t ecap = p.expert_capacity > 0
                           ? static_cast<int64_t>(std::ceil(p.expert_capacity * pairs / E))
                           : (1ll << 62);
  const int64_t rcap = p.rank_capacity > 0
                           ? static_cast<int64_t>(std::ceil(p.rank_capacity * pairs / P))
                           : (1ll << 62);
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) ids[t * K + j] = cand[t * W + j];
  auto before = [&](int64_t a, int64_t b) {  // a is shed before b
    const float pa = prio[(a / K) * W + a % K], pb = prio[(b / K) * W + b % K];
    return pa != pb ? pa < pb : a > b;
  };
  std::vector<bool> shed(static_cast<size_t>(T * K), false);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> mine;
    for (int64_t i = 0; i < T * K; ++i)
      if (ids[i] == e) mine.push_back(i);
    std::sort(mine.begin(), mine.end(), before);
    for (int64_t i = 0; i + ecap < static_cast<int64_t>(mine.size()); ++i) shed[mine[i]] = true;
  }
  for (int64_t r = 0; r < P; ++r) {
    std::vector<int64_t> mine;
    for (int64_t i = 0; i < T * K; ++i)
      if (!shed[i] && rank[ids[i]] == r) mine.push_back(i);
    std::sort(mine.begin(), mine.end(), before);
    for (int64_t i = 0; i + rcap < static_cast<int64_t>(mine.size()); ++i) shed[mine[i]] = true;
  }
  std::vector<int64_t> order;
  for (int64_t i = 0; i < T * K; ++i)
    if (shed[i]) order.push_back(i);
  std::sort(order.begin(), order.end(), before);
  const int64_t budget = static_cast<int64_t>(std::floor(p.max_reroute_share * pairs));
  int64_t moved = 0;
  for (int64_t i : order) {
    if (moved == budget) break;
    const int64_t t = i / K;
    for (int64_t c = K; c < W; ++c) {
      const int32_t e = cand[t * W + c];
      int64_t le = 0, lr = 0;
      for (int64_t q = 0; q < T * K; ++q) {
        le += ids[q] == e;
        lr += rank[ids[q]] == rank[e];
      }
      bool used = false;
      for (int64_t j = 0; j < K; ++j) used = used || ids[t * K + j] == e;
      if (le < ecap && lr < rcap && !used) {
        ids[i] = e;
        ++moved;
        break;
      }
    }
  }
  return ids;
}

struct Loads {
  std::vector<int64_t> expert, rank;
};
Loads loads_of(const std::vector<int32_t>& ids, const std::vector<int32_t>& rank, int64_t E,
               int64_t P) {
  Loads l{std::vector<int64_t>(static_cast<size_t>(E), 0),
          std::vector<int64_t>(static_cast<size_t>(P), 0)};
  for (int32_t e : ids) {
    ++l.expert[e];
    ++l.rank[rank[e]];
  }
  return l;
}

void check_guarantees(const ops::OverflowParams& p, int64_t P, uint64_t seed, bool expect_full) {
  Rng rng(seed);
  const int64_t T = p.tokens, E = p.experts, K = p.top_k, W = K + p.extra;
  std::vector<int32_t> cand;
  std::vector<float> prio;
  draw_candidates(rng, T, E, W, cand, prio);
  const std::vector<int32_t> rank = ops::contiguous_expert_ranks(E, P);
  std::vector<int32_t> ids(static_cast<size_t>(T * K)), from(ids.size());
  const ops::OverflowStats st =
      ops::overflow_assign(p, cand.data(), prio.data(), rank, ids.data(), from.data());

  std::vector<int32_t> primary(ids.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) primary[t * K + j] = cand[t * W + j];
  const Loads b = loads_of(primary, rank, E, P), a = loads_of(ids, rank, E, P);
  int64_t moved = 0;
  std::set<int32_t> receivers;
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> mine;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = ids[t * K + j];
      // Only experts the token scored, at the recorded candidate position.
      ASSERT_GE(from[t * K + j], 0);
      ASSERT_LT(from[t * K + j], W);
      ASSERT_EQ(cand[t * W + from[t * K + j]], e);
      mine.insert(e);
      if (e != primary[t * K + j]) {
        ++moved;
        receivers.insert(e);
      }
    }
    ASSERT_EQ(static_cast<int64_t>(mine.size()), K) << "token " << t << " lost or doubled a slot";
  }
  EXPECT_EQ(moved, st.rerouted);
  EXPECT_LE(st.rerouted, static_cast<int64_t>(std::floor(p.max_reroute_share * T * K)));
  for (int32_t e : receivers) {
    EXPECT_LE(a.expert[e], st.expert_cap) << "receiver " << e;
    EXPECT_LE(a.rank[rank[e]], st.rank_cap) << "receiver rank " << rank[e];
  }
  for (int64_t e = 0; e < E; ++e) EXPECT_LE(a.expert[e], std::max(st.expert_cap, b.expert[e]));
  for (int64_t r = 0; r < P; ++r) EXPECT_LE(a.rank[r], std::max(st.rank_cap, b.rank[r]));
  EXPECT_EQ(st.max_expert_after, *std::max_element(a.expert.begin(), a.expert.end()));
  EXPECT_EQ(st.max_rank_before, *std::max_element(b.rank.begin(), b.rank.end()));
  EXPECT_GT(st.shed, 0) << "the draw is skewed: something must be over capacity";
  EXPECT_GT(st.rerouted, 0);
  if (expect_full) {
    EXPECT_EQ(st.over_capacity, 0);
    EXPECT_LE(st.max_expert_after, st.expert_cap);
    EXPECT_LE(st.max_rank_after, st.rank_cap);
  }
  EXPECT_EQ(ids, ref_assign(p, cand, prio, rank)) << "seed " << seed;
}

TEST(OverflowRoute, BudgetedGuaranteesAndReference) {
  for (uint64_t s = 1; s <= 6; ++s)
    check_guarantees({.tokens = 97,
                      .experts = 24,
                      .top_k = 4,
                      .extra = 4,
                      .expert_capacity = 1.3f,
                      .rank_capacity = 1.1f,
                      .max_reroute_share = 0.05f},
                     4, s, false);
}

TEST(OverflowRoute, AmpleCandidatesMeetCapacity) {
  // Every expert is a candidate and the budget is unbounded: the promise holds everywhere.
  for (uint64_t s = 1; s <= 4; ++s)
    check_guarantees({.tokens = 61,
                      .experts = 12,
                      .top_k = 2,
                      .extra = 10,
                      .expert_capacity = 1.5f,
                      .rank_capacity = 1.2f,
                      .max_reroute_share = 1.f},
                     3, s, true);
}

TEST(OverflowRoute, NoBoundNoChange) {
  Rng rng(test::test_seed());
  std::vector<int32_t> cand;
  std::vector<float> prio;
  draw_candidates(rng, 20, 8, 5, cand, prio);
  std::vector<int32_t> ids(40);
  const auto st = ops::overflow_assign({.tokens = 20,
                                        .experts = 8,
                                        .top_k = 2,
                                        .extra = 3,
                                        .expert_capacity = 0.f,
                                        .rank_capacity = 0.f},
                                       cand.data(), prio.data(), ops::contiguous_expert_ranks(8, 2),
                                       ids.data(), nullptr);
  EXPECT_EQ(st.rerouted, 0);
  for (int64_t t = 0; t < 20; ++t)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(ids[t * 2 + j], cand[t * 5 + j]);
}

TEST(OverflowRoute, TypedErrors) {
  std::vector<int32_t> cand = {0, 9}, ids(1);
  std::vector<float> prio = {1.f, 0.5f};
  EXPECT_THROW(
      ops::overflow_assign({.tokens = 1, .experts = 4, .top_k = 1, .extra = 1}, cand.data(),
                           prio.data(), ops::contiguous_expert_ranks(4, 2), ids.data(), nullptr),
      ValueError);
  EXPECT_THROW(ops::contiguous_expert_ranks(10, 4), ConfigError);
}

// logits [T,E] -> (router top-(k+m) candidates, overflow assignment) -> weights [T,k].
class OverflowCase : public test::OpCase {
 public:
  static constexpr int64_t T = 16, E = 10, K = 3, M = 3, P = 2;
  ops::OverflowParams op{.tokens = T,
                         .experts = E,
                         .top_k = K,
                         .extra = M,
                         .expert_capacity = 1.0f,
                         .rank_capacity = 1.05f,
                         .max_reroute_share = 0.5f};
  ops::RouterParams rp{.tokens = T, .experts = E, .top_k = K};
  bool softmax = false;
  int64_t last_rerouted = 0;

  std::string name() const override { return softmax ? "overflow_softmax" : "overflow_sigmoid"; }
  std::vector<test::InputSpec> inputs() const override {
    return {{.name = "logits", .shape = {T, E}, .init = [](Rng& r, Tensor& t) {
               // Experts 0 and 1 hot, so capacity binds.
               for (int64_t i = 0; i < T * E; ++i)
                 t.f32()[i] = static_cast<float>(r.normal() + (i % E < 2 ? 1.5 : 0.0));
             }}};
  }
  std::vector<test::OutputSpec> outputs() const override {
    return {{"ids", false}, {"weights", true}};
  }
  ops::RouterParams cand_params() const {
    ops::RouterParams c = rp;
    c.top_k = K + M;
    return c;
  }
  Tensor scores_, ids_;
  std::vector<Tensor> forward(Context& ctx, test::GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    rp.score = softmax ? ops::ScoreFunc::Softmax : ops::ScoreFunc::Sigmoid;
    scores_ = alloc({T, E});
    Tensor cand = alloc({T, K + M}, DType::I32), cw = alloc({T, K + M});
    ops::router_forward(ctx, cand_params(), in[0], Tensor(), scores_, cand, cw);
    ids_ = alloc({T, K}, DType::I32);
    Tensor w = alloc({T, K});
    const auto st = ops::overflow_route_forward(ctx, op, rp, ops::contiguous_expert_ranks(E, P),
                                                scores_, Tensor(), cand, ids_, w);
    last_rerouted = st.rerouted;
    return {ids_, w};
  }
  void backward(Context& ctx, test::GuardedAlloc&, const std::vector<Tensor>&,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::overflow_route_backward(ctx, rp, scores_, ids_, dout[1], grads[0]);
  }
  DVec scores_of(const DVec& z) const {
    DVec s(z.size());
    for (int64_t t = 0; t < T; ++t) {
      double mx = -1e300, sum = 0;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, z[t * E + e]);
      for (int64_t e = 0; e < E; ++e) {
        const double v = z[t * E + e];
        s[t * E + e] = softmax ? std::exp(v - mx) : 1.0 / (1.0 + std::exp(-v));
        sum += s[t * E + e];
      }
      if (softmax)
        for (int64_t e = 0; e < E; ++e) s[t * E + e] /= sum;
    }
    return s;
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    const DVec s = scores_of(in[0]);
    std::vector<int32_t> cand(static_cast<size_t>(T * (K + M)));
    std::vector<float> prio(cand.size());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> idx(E);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(),
                       [&](int32_t a, int32_t b) { return s[t * E + a] > s[t * E + b]; });
      for (int64_t j = 0; j < K + M; ++j) {
        cand[t * (K + M) + j] = idx[j];
        prio[t * (K + M) + j] = static_cast<float>(s[t * E + idx[j]]);
      }
    }
    const std::vector<int32_t> ids = ref_assign(op, cand, prio, ops::contiguous_expert_ranks(E, P));
    DVec di(ids.begin(), ids.end()), w(static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) sum += s[t * E + ids[t * K + j]];
      for (int64_t j = 0; j < K; ++j) w[t * K + j] = s[t * E + ids[t * K + j]] / (sum + 1e-20);
    }
    return {di, w};
  }
  // Selection (and shedding across tokens) compares scores: reject draws with near-ties, which
  // fp32 and double, or a finite-difference step, could order differently.
  bool accept(const std::vector<DVec>& in) const override {
    DVec s = scores_of(in[0]);
    std::sort(s.begin(), s.end());
    for (size_t i = 1; i < s.size(); ++i)
      if (s[i] - s[i - 1] < 2e-5) return false;
    return true;
  }
};

TEST(OverflowRoute, SigmoidBackwardMatchesFiniteDifferences) {
  OverflowCase c;
  test::check_op(c);
  EXPECT_GT(c.last_rerouted, 0) << "the case must exercise rerouting";
}

TEST(OverflowRoute, SoftmaxBackwardMatchesFiniteDifferences) {
  OverflowCase c;
  c.softmax = true;
  test::check_op(c);
  EXPECT_GT(c.last_rerouted, 0) << "the case must exercise rerouting";
}

}  // namespace
}  // namespace mt
