#include "ops/overflow_route.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/moe_rules.h"

// overflow_assign and contiguous_expert_ranks are host algorithms of the public API (the routing
// simulator calls them too), so they stay in mt::ops; only the tensor entry has a cpu:: body.
namespace mt::ops {

namespace {

// Pair a is shed (and served) before pair b: lower priority first, then the later flat slot.
struct ShedOrder {
  const float* key;  // priority of each (token, slot) pair, flat
  bool operator()(int64_t a, int64_t b) const { return key[a] != key[b] ? key[a] < key[b] : a > b; }
};

int64_t cap_of(float factor, int64_t pairs, int64_t bins) {
  if (factor <= 0.f) return INT64_MAX;
  return static_cast<int64_t>(std::ceil(static_cast<double>(factor) * static_cast<double>(pairs) /
                                        static_cast<double>(bins)));
}

}  // namespace

std::vector<int32_t> contiguous_expert_ranks(int64_t experts, int64_t ranks) {
  const std::string ep = expert_parallel_error(ranks, experts);
  MT_CHECK(experts > 0 && ep.empty(), ConfigError, ep.empty() ? "no experts" : ep);
  std::vector<int32_t> r(static_cast<size_t>(experts));
  const int64_t per = experts / ranks;
  for (int64_t e = 0; e < experts; ++e) r[e] = static_cast<int32_t>(e / per);
  return r;
}

OverflowStats overflow_assign(const OverflowParams& p, const int32_t* cand, const float* prio,
                              const std::vector<int32_t>& expert_rank, int32_t* out_ids,
                              int32_t* out_from) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k, W = p.top_k + p.extra;
  MT_CHECK(T >= 0 && E > 0 && K > 0 && p.extra >= 0 && W <= E, ValueError, "overflow routing: ", K,
           " + ", p.extra, " candidates of ", E, " experts");
  MT_CHECK(static_cast<int64_t>(expert_rank.size()) == E, ShapeError, "expert_rank has ",
           expert_rank.size(), " entries, expected ", E);
  MT_CHECK(p.max_reroute_share >= 0.f && p.max_reroute_share <= 1.f, ValueError,
           "max_reroute_share ", p.max_reroute_share, " outside [0, 1]");
  int64_t P = 0;
  for (int32_t r : expert_rank) {
    MT_CHECK(r >= 0, ValueError, "negative EP rank ", r, " in expert_rank");
    P = std::max<int64_t>(P, r + 1);
  }
  OverflowStats st;
  st.pairs = T * K;
  st.expert_cap = cap_of(p.expert_capacity, st.pairs, E);
  st.rank_cap = cap_of(p.rank_capacity, st.pairs, P);

  std::vector<int64_t> load(static_cast<size_t>(E), 0), rload(static_cast<size_t>(P), 0);
  for (int64_t i = 0; i < T * W; ++i)
    MT_CHECK(cand[i] >= 0 && cand[i] < E, ValueError, "candidate expert ", cand[i], " of token ",
             i / W, " outside [0, ", E, ")");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = cand[t * W + j];
      out_ids[t * K + j] = e;
      if (out_from) out_from[t * K + j] = static_cast<int32_t>(j);
      ++load[e];
      ++rload[expert_rank[e]];
    }
  st.max_expert_before = E ? *std::max_element(load.begin(), load.end()) : 0;
  st.max_rank_before = *std::max_element(rload.begin(), rload.end());

  // Pairs grouped by expert (counting sort keeps them in flat order).
  std::vector<int64_t> off(static_cast<size_t>(E + 1), 0), pairs(static_cast<size_t>(T * K));
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + load[e];
  {
    std::vector<int64_t> fill(off.begin(), off.end() - 1);
    for (int64_t i = 0; i < T * K; ++i) pairs[fill[out_ids[i]]++] = i;
  }
  std::vector<float> key(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) key[t * K + j] = prio[t * W + j];
  const ShedOrder order{key.data()};
  std::vector<char> is_shed(static_cast<size_t>(T * K), 0);
  std::vector<int64_t> shed;
  std::vector<int64_t> after(load), rafter(rload);  // loads once the shed pairs are gone
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = load[e] - st.expert_cap;
    if (n <= 0) continue;
    auto b = pairs.begin() + off[e], en = pairs.begin() + off[e + 1];
    std::nth_element(b, b + (n - 1), en, order);
    for (auto it = b; it != b + n; ++it) {
      is_shed[*it] = 1;
      shed.push_back(*it);
    }
    after[e] -= n;
    rafter[expert_rank[e]] -= n;
  }
  if (st.rank_cap != INT64_MAX) {
    std::vector<std::vector<int64_t>> by_rank(static_cast<size_t>(P));
    for (int64_t r = 0; r < P; ++r)
      if (rafter[r] > st.rank_cap) by_rank[r].reserve(static_cast<size_t>(rafter[r]));
    for (int64_t i = 0; i < T * K; ++i) {
      const int32_t r = expert_rank[out_ids[i]];
      if (!is_shed[i] && rafter[r] > st.rank_cap) by_rank[r].push_back(i);
    }
    for (int64_t r = 0; r < P; ++r) {
      const int64_t n = rafter[r] - st.rank_cap;
      if (n <= 0) continue;
      auto& v = by_rank[r];
      std::nth_element(v.begin(), v.begin() + (n - 1), v.end(), order);
      for (int64_t i = 0; i < n; ++i) {
        is_shed[v[i]] = 1;
        shed.push_back(v[i]);
        --after[out_ids[v[i]]];
      }
      rafter[r] -= n;
    }
  }
  st.shed = static_cast<int64_t>(shed.size());
  const int64_t budget = static_cast<int64_t>(
      std::floor(static_cast<double>(p.max_reroute_share) * static_cast<double>(st.pairs)));
  std::sort(shed.begin(), shed.end(), order);
  for (int64_t i : shed) {
    if (st.rerouted >= budget) break;
    const int64_t t = i / K;
    const int32_t src = out_ids[i];
    for (int64_t c = K; c < W; ++c) {
      const int32_t e = cand[t * W + c];
      if (load[e] >= st.expert_cap || rload[expert_rank[e]] >= st.rank_cap) continue;
      bool used = false;
      for (int64_t j = 0; j < K; ++j) used = used || out_ids[t * K + j] == e;
      if (used) continue;
      out_ids[i] = e;
      if (out_from) out_from[i] = static_cast<int32_t>(c);
      --load[src];
      --rload[expert_rank[src]];
      ++load[e];
      ++rload[expert_rank[e]];
      ++st.rerouted;
      break;
    }
  }
  for (int64_t e = 0; e < E; ++e) st.over_capacity += std::max<int64_t>(0, load[e] - st.expert_cap);
  if (st.rank_cap != INT64_MAX)
    for (int64_t r = 0; r < P; ++r)
      st.over_capacity += std::max<int64_t>(0, rload[r] - st.rank_cap);
  st.max_expert_after = *std::max_element(load.begin(), load.end());
  st.max_rank_after = *std::max_element(rload.begin(), rload.end());
  return st;
}

namespace cpu {

OverflowStats overflow_route_forward(Context& ctx, const OverflowParams& p, const RouterParams& rp,
                                     const std::vector<int32_t>& expert_rank, const Tensor& scores,
                                     const Tensor& bias, const Tensor& cand, Tensor& ids,
                                     Tensor& weights) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k, W = p.top_k + p.extra;
  const float* s = scores.f32();
  const int32_t* c = cand.i32();
  std::vector<float> prio(static_cast<size_t>(T * W));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < W; ++j) {
      const int32_t e = c[t * W + j];
      prio[t * W + j] = s[t * E + e] + (bias.defined() ? bias.f32()[e] : 0.f);
    }
  const OverflowStats st = ops::overflow_assign(p, c, prio.data(), expert_rank, ids.i32(), nullptr);
  const int32_t* id = ids.i32();
  float* w = weights.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += s[t * E + id[t * K + j]];
    const double scale = rp.norm_topk_prob ? rp.routed_scaling / (sum + 1e-20)
                                           : static_cast<double>(rp.routed_scaling);
    for (int64_t j = 0; j < K; ++j)
      w[t * K + j] = static_cast<float>(s[t * E + id[t * K + j]] * scale);
  }
  return st;
}

}  // namespace cpu

}  // namespace mt::ops
