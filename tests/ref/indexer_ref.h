// Double-precision reference of the DSA lightning indexer: scores, top-k selection and the KL
// loss against the (L1-normalised) attention target. Used only by tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

inline bool ref_valid(double pos, int64_t T) {
  return pos >= 0 && pos < static_cast<double>(T);
}

// I[t, j] = scale * sum_h w[t,h] * max(0, q[t,h,:] . k[idx[t,j],:]); 0 on unused slots.
inline DVec indexer_scores(const DVec& q, const DVec& k, const DVec& w, const DVec& idx, int64_t T,
                           int64_t H, int64_t D, int64_t kmax, double scale) {
  DVec out(static_cast<size_t>(T * kmax), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < kmax; ++j) {
      const double pos = idx[t * kmax + j];
      if (!ref_valid(pos, T)) continue;
      const int64_t s = static_cast<int64_t>(pos);
      double acc = 0;
      for (int64_t h = 0; h < H; ++h) {
        double d = 0;
        for (int64_t e = 0; e < D; ++e) d += q[(t * H + h) * D + e] * k[s * D + e];
        acc += w[t * H + h] * std::max(0.0, d);
      }
      out[t * kmax + j] = scale * acc;
    }
  return out;
}

// The q[t,h,:] . k[s,:] the indexer's ReLUs read on the table `idx` [T, kmax] (every row t, valid
// slot s and head h, in that order): `margin`, the smallest |q . k| / (|q| |k|), how far the
// scores are from a kink of their ReLU (a finite-difference step that crosses one measures the
// mean of the two one-sided slopes, not the gradient); `active`, each one's sign (1 where
// positive, else 0), so that a difference quotient's two points can be compared.
struct ReluKinks {
  double margin = std::numeric_limits<double>::infinity();
  DVec active;
};

inline ReluKinks relu_kinks(const DVec& q, const DVec& k, const DVec& idx, int64_t T, int64_t H,
                            int64_t D, int64_t kmax) {
  ReluKinks out;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < kmax; ++j) {
      const double pos = idx[t * kmax + j];
      if (!ref_valid(pos, T)) continue;
      const int64_t s = static_cast<int64_t>(pos);
      for (int64_t h = 0; h < H; ++h) {
        double d = 0, qq = 0, kk = 0;
        for (int64_t e = 0; e < D; ++e) {
          const double a = q[(t * H + h) * D + e], b = k[s * D + e];
          d += a * b;
          qq += a * a;
          kk += b * b;
        }
        out.margin = std::min(out.margin, std::abs(d) / std::max(std::sqrt(qq * kk), 1e-300));
        out.active.push_back(d > 0 ? 1.0 : 0.0);
      }
    }
  return out;
}

// Per row: the min(topk, valid) best candidates (score descending, position ascending on ties),
// listed by increasing position, then -1.
inline DVec topk_select(const DVec& scores, const DVec& cand, int64_t T, int64_t kin,
                        int64_t topk) {
  DVec out(static_cast<size_t>(T * topk), -1.0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<double, double>> c;
    for (int64_t j = 0; j < kin; ++j)
      if (ref_valid(cand[t * kin + j], T)) c.emplace_back(scores[t * kin + j], cand[t * kin + j]);
    std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    const size_t keff = std::min(c.size(), static_cast<size_t>(topk));
    std::vector<double> sel;
    for (size_t i = 0; i < keff; ++i) sel.push_back(c[i].second);
    std::sort(sel.begin(), sel.end());
    for (size_t i = 0; i < keff; ++i) out[t * topk + static_cast<int64_t>(i)] = sel[i];
  }
  return out;
}

// sum_t KL(target_t / |target_t|_1 || softmax(I_t)) / T over valid slots.
inline double indexer_kl(const DVec& scores, const DVec& target, const DVec& idx, int64_t T,
                         int64_t kmax) {
  double total = 0;
  for (int64_t t = 0; t < T; ++t) {
    double m = -std::numeric_limits<double>::infinity(), ts = 0;
    for (int64_t j = 0; j < kmax; ++j)
      if (ref_valid(idx[t * kmax + j], T)) {
        m = std::max(m, scores[t * kmax + j]);
        ts += target[t * kmax + j];
      }
    if (m == -std::numeric_limits<double>::infinity() || ts <= 0) continue;
    double z = 0;
    for (int64_t j = 0; j < kmax; ++j)
      if (ref_valid(idx[t * kmax + j], T)) z += std::exp(scores[t * kmax + j] - m);
    const double logz = m + std::log(z);
    for (int64_t j = 0; j < kmax; ++j) {
      if (!ref_valid(idx[t * kmax + j], T) || target[t * kmax + j] <= 0) continue;
      const double p = target[t * kmax + j] / ts;
      total += p * (std::log(p) - (scores[t * kmax + j] - logz));
    }
  }
  return T ? total / static_cast<double>(T) : 0.0;
}

}  // namespace mt::ref
