#include "ops/router.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "ops/activation.h"
#include "ops/moe_rules.h"

namespace mt::ops::cpu {

namespace {

constexpr double kNormEps = 1e-20;

// Descending value, lower index first on ties: a strict weak order that makes selection
// deterministic whatever the sort implementation.
struct ByScore {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// d(loss)/d(scores) row -> d(loss)/d(logits) row (written).
void score_backward_row(ScoreFunc f, const float* s, const float* ds, float* dl, int64_t e) {
  if (f == ScoreFunc::Softmax) {
    double dot = 0;
    for (int64_t i = 0; i < e; ++i) dot += static_cast<double>(s[i]) * ds[i];
    for (int64_t i = 0; i < e; ++i) dl[i] = s[i] * (ds[i] - static_cast<float>(dot));
  } else {
    for (int64_t i = 0; i < e; ++i) dl[i] = ds[i] * s[i] * (1.0f - s[i]);
  }
}

// A row of logits' largest value and the sum of exp(l - max): the row's log-sum-exp is
// max + log(sum) and its softmax exp(l - max) / sum.
std::pair<double, double> row_exp(const float* l, int64_t E) {
  double mx = l[0];
  for (int64_t i = 1; i < E; ++i) mx = std::max(mx, static_cast<double>(l[i]));
  double sum = 0;
  for (int64_t i = 0; i < E; ++i) sum += std::exp(l[i] - mx);
  return {mx, sum};
}

}  // namespace

void router_forward(Context& ctx, const RouterParams& p, const Tensor& logits, const Tensor& bias,
                    Tensor& scores, Tensor& ids, Tensor& weights) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k;
  const bool has_bias = bias.defined() && bias.numel() > 0;
  const int64_t G = p.n_group, gsize = E / G;

  ArenaScope scope(ctx.workspace());
  Tensor sel_t = ctx.workspace().alloc({T, E});
  Tensor idx_t = ctx.workspace().alloc({T, E}, DType::I32);
  Tensor gsc_t = ctx.workspace().alloc({T, G});
  Tensor gidx_t = ctx.workspace().alloc({T, G}, DType::I32);
  const float* pl = logits.f32();
  const float* pb = has_bias ? bias.f32() : nullptr;
  float* ps = scores.f32();
  int32_t* pid = ids.i32();
  float* pw = weights.f32();
  float* psel_all = sel_t.f32();
  int32_t* pidx_all = idx_t.i32();
  float* pg_all = gsc_t.f32();
  int32_t* pgi_all = gidx_t.i32();

#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* l = pl + t * E;
    float* s = ps + t * E;
    if (p.score == ScoreFunc::Softmax) {
      float mx = l[0];
      for (int64_t i = 1; i < E; ++i) mx = std::max(mx, l[i]);
      double sum = 0;
      for (int64_t i = 0; i < E; ++i) {
        s[i] = std::exp(l[i] - mx);
        sum += s[i];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t i = 0; i < E; ++i) s[i] *= inv;
    } else {
      for (int64_t i = 0; i < E; ++i) s[i] = sigmoidf(l[i]);
    }
    float* sel = psel_all + t * E;
    for (int64_t i = 0; i < E; ++i) sel[i] = s[i] + (pb ? pb[i] : 0.0f);

    int32_t* idx = pidx_all + t * E;
    int64_t n_cand = 0;
    if (G > 1) {
      float* gs = pg_all + t * G;
      for (int64_t g = 0; g < G; ++g)
        gs[g] = group_score(sel + g * gsize, gsize, p.score == ScoreFunc::Sigmoid);
      int32_t* gi = pgi_all + t * G;
      for (int64_t g = 0; g < G; ++g) gi[g] = static_cast<int32_t>(g);
      std::partial_sort(gi, gi + p.topk_group, gi + G, ByScore{gs});
      // Candidates in ascending expert order so the tie rule below stays "lower index first".
      std::sort(gi, gi + p.topk_group);
      for (int64_t j = 0; j < p.topk_group; ++j)
        for (int64_t i = 0; i < gsize; ++i) idx[n_cand++] = static_cast<int32_t>(gi[j] * gsize + i);
    } else {
      for (int64_t i = 0; i < E; ++i) idx[n_cand++] = static_cast<int32_t>(i);
    }
    std::partial_sort(idx, idx + K, idx + n_cand, ByScore{sel});

    double denom = 0;
    for (int64_t j = 0; j < K; ++j) denom += s[idx[j]];
    const double scale = p.norm_topk_prob ? p.routed_scaling / (denom + kNormEps)
                                          : static_cast<double>(p.routed_scaling);
    for (int64_t j = 0; j < K; ++j) {
      pid[t * K + j] = idx[j];
      pw[t * K + j] = static_cast<float>(s[idx[j]] * scale);
    }
  }
}

void router_backward(Context& ctx, const RouterParams& p, const Tensor& scores, const Tensor& ids,
                     const Tensor& dweights, Tensor& dlogits) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k;
  ArenaScope scope(ctx.workspace());
  Tensor ds_t = ctx.workspace().alloc({T, E});
  const float* ps = scores.f32();
  const int32_t* pid = ids.i32();
  const float* pdw = dweights.f32();
  float* pds_all = ds_t.f32();
  float* pdl = dlogits.f32();
  const double c = p.routed_scaling;

#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* s = ps + t * E;
    const int32_t* id = pid + t * K;
    const float* dw = pdw + t * K;
    float* ds = pds_all + t * E;
    std::fill(ds, ds + E, 0.0f);
    if (p.norm_topk_prob) {
      double denom = 0, dot = 0;
      for (int64_t j = 0; j < K; ++j) {
        denom += s[id[j]];
        dot += static_cast<double>(dw[j]) * s[id[j]];
      }
      denom += kNormEps;
      for (int64_t j = 0; j < K; ++j)
        ds[id[j]] = static_cast<float>(c * (dw[j] / denom - dot / (denom * denom)));
    } else {
      for (int64_t j = 0; j < K; ++j) ds[id[j]] = static_cast<float>(c * dw[j]);
    }
    score_backward_row(p.score, s, ds, pdl + t * E, E);
  }
}

void router_seq_aux_loss(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                         const Tensor& scores, const Tensor& ids, Tensor& loss) {
  const int64_t E = p.experts, K = p.top_k;
  ArenaScope scope(ctx.workspace());
  Tensor cnt_t = ctx.workspace().alloc({seq.num_seqs, E});
  Tensor prob_t = ctx.workspace().alloc({seq.num_seqs, E});
  const float* ps = scores.f32();
  const int32_t* pid = ids.i32();
  float* pcnt = cnt_t.f32();
  float* pprob = prob_t.f32();
  const std::vector<int64_t>& off = seq.offsets;
  double total = 0;
#pragma omp parallel for num_threads(ctx.threads()) schedule(dynamic) reduction(+ : total)
  for (int64_t d = 0; d < seq.num_seqs; ++d) {
    const int64_t b = off[d], e = off[d + 1], n = e - b;
    float* cnt = pcnt + d * E;
    float* prob = pprob + d * E;
    std::fill(cnt, cnt + E, 0.0f);
    std::fill(prob, prob + E, 0.0f);
    for (int64_t t = b; t < e; ++t) {
      for (int64_t j = 0; j < K; ++j) cnt[pid[t * K + j]] += 1.0f;
      double sum = 0;
      for (int64_t i = 0; i < E; ++i) sum += ps[t * E + i];
      for (int64_t i = 0; i < E; ++i) prob[i] += static_cast<float>(ps[t * E + i] / sum);
    }
    double l = 0;
    for (int64_t i = 0; i < E; ++i)
      l += (static_cast<double>(E) / static_cast<double>(K * n) * cnt[i]) * (prob[i] / n);
    total += l;
  }
  loss.f64()[0] = total / static_cast<double>(seq.num_seqs);
}

void router_seq_aux_backward(Context& ctx, const RouterParams& p, const SeqInfo& seq,
                             const Tensor& scores, const Tensor& ids, float grad, Tensor& dlogits) {
  const int64_t T = p.tokens, E = p.experts, K = p.top_k;
  ArenaScope scope(ctx.workspace());
  Tensor f_t = ctx.workspace().zeros({seq.num_seqs, E});
  Tensor ds_t = ctx.workspace().alloc({T, E});
  Tensor dl_t = ctx.workspace().alloc({T, E});
  const float* ps = scores.f32();
  const int32_t* pid = ids.i32();
  float* pf = f_t.f32();
  float* pds = ds_t.f32();
  float* pdl_tmp = dl_t.f32();
  float* pdl = dlogits.f32();
  const double D = static_cast<double>(seq.num_seqs);

  for (int64_t d = 0; d < seq.num_seqs; ++d) {
    const int64_t b = seq.offsets[d], n = seq.offsets[d + 1] - b;
    float* f = pf + d * E;
    for (int64_t t = b; t < b + n; ++t)
      for (int64_t j = 0; j < K; ++j) f[pid[t * K + j]] += 1.0f;
    for (int64_t i = 0; i < E; ++i)
      f[i] *= static_cast<float>(static_cast<double>(E) / static_cast<double>(K * n));
  }
  const std::vector<int64_t>& off = seq.offsets;
#pragma omp parallel for num_threads(ctx.threads()) schedule(dynamic)
  for (int64_t d = 0; d < seq.num_seqs; ++d) {
    const int64_t b = off[d], e = off[d + 1];
    const double g = grad / (D * static_cast<double>(e - b));
    const float* f = pf + d * E;
    for (int64_t t = b; t < e; ++t) {
      // P_i uses s_i / S: d/ds_m = (f_m - sum_i f_i s_i / S) / S.
      const float* s = ps + t * E;
      double sum = 0, fs = 0;
      for (int64_t i = 0; i < E; ++i) {
        sum += s[i];
        fs += static_cast<double>(f[i]) * s[i];
      }
      float* ds = pds + t * E;
      for (int64_t i = 0; i < E; ++i) ds[i] = static_cast<float>(g * (f[i] - fs / sum) / sum);
      float* dl = pdl_tmp + t * E;
      score_backward_row(p.score, s, ds, dl, E);
      for (int64_t i = 0; i < E; ++i) pdl[t * E + i] += dl[i];
    }
  }
}

void router_z_loss(Context& ctx, const RouterParams& p, const Tensor& logits, Tensor& loss) {
  const int64_t T = p.tokens, E = p.experts;
  loss.f64()[0] = 0;
  if (T == 0) return;
  const float* pl = logits.f32();
  double total = 0;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static) reduction(+ : total)
  for (int64_t t = 0; t < T; ++t) {
    const float* l = pl + t * E;
    const auto [mx, sum] = row_exp(l, E);
    const double lse = mx + std::log(sum);
    total += lse * lse;
  }
  loss.f64()[0] = total / static_cast<double>(T);
}

void router_z_loss_backward(Context& ctx, const RouterParams& p, const Tensor& logits, float grad,
                            Tensor& dlogits) {
  const int64_t T = p.tokens, E = p.experts;
  const float* pl = logits.f32();
  float* pdl = dlogits.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* l = pl + t * E;
    const auto [mx, sum] = row_exp(l, E);
    const double lse = mx + std::log(sum);
    const double c = grad * 2.0 * lse / static_cast<double>(T);
    for (int64_t i = 0; i < E; ++i)
      pdl[t * E + i] += static_cast<float>(c * std::exp(l[i] - mx) / sum);
  }
}

void expert_load_counts(Context&, const Tensor& ids, int64_t experts, Tensor& counts) {
  const int32_t* pid = ids.i32();
  int64_t* c = counts.i64();
  std::fill(c, c + experts, int64_t{0});
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ++c[pid[i]];
  }
}

void router_bias_update(Context&, const Tensor& load, float rate, Tensor& bias) {
  const int64_t E = load.dim(0);
  const int64_t* l = load.i64();
  float* b = bias.f32();
  double mean = 0;
  for (int64_t i = 0; i < E; ++i) mean += static_cast<double>(l[i]);
  mean /= static_cast<double>(std::max<int64_t>(E, 1));
  for (int64_t i = 0; i < E; ++i) {
    const double diff = mean - static_cast<double>(l[i]);
    b[i] += rate * static_cast<float>((diff > 0) - (diff < 0));
  }
}

}  // namespace mt::ops::cpu
