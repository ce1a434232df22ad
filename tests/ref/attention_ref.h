// Double-precision reference of index-list softmax attention (and of dense causal attention as
// the index list "same document, s <= t"). Used only by tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

struct AttnRefOut {
  DVec o;    // [T, H, Dv]
  DVec lse;  // [T, H]; -inf for a query without valid slots
  DVec p;    // [T, H, kmax] attention probabilities (0 on unused slots)
};

// q [T,H,Dk], k [T,Hk,Dk], v [T,Hk,Dv], idx [T,kmax] (as doubles or ints; < 0 or >= T unused).
inline AttnRefOut attention(const DVec& q, const DVec& k, const DVec& v, const DVec& idx, int64_t T,
                            int64_t H, int64_t Hk, int64_t Dk, int64_t Dv, int64_t kmax,
                            double scale) {
  AttnRefOut r;
  r.o.assign(static_cast<size_t>(T * H * Dv), 0.0);
  r.lse.assign(static_cast<size_t>(T * H), -std::numeric_limits<double>::infinity());
  r.p.assign(static_cast<size_t>(T * H * kmax), 0.0);
  const int64_t G = H / Hk;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / G;
      std::vector<double> s(static_cast<size_t>(kmax), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < kmax; ++j) {
        const double pos = idx[t * kmax + j];
        if (pos < 0 || pos >= static_cast<double>(T)) continue;
        const int64_t sp = static_cast<int64_t>(pos);
        double d = 0;
        for (int64_t e = 0; e < Dk; ++e) d += q[(t * H + h) * Dk + e] * k[(sp * Hk + g) * Dk + e];
        s[j] = scale * d;
        m = std::max(m, s[j]);
      }
      if (m == -std::numeric_limits<double>::infinity()) continue;
      double z = 0;
      for (int64_t j = 0; j < kmax; ++j) {
        const double pos = idx[t * kmax + j];
        if (pos < 0 || pos >= static_cast<double>(T)) continue;
        z += std::exp(s[j] - m);
      }
      r.lse[t * H + h] = m + std::log(z);
      for (int64_t j = 0; j < kmax; ++j) {
        const double pos = idx[t * kmax + j];
        if (pos < 0 || pos >= static_cast<double>(T)) continue;
        const int64_t sp = static_cast<int64_t>(pos);
        const double pr = std::exp(s[j] - r.lse[t * H + h]);
        r.p[(t * H + h) * kmax + j] = pr;
        for (int64_t e = 0; e < Dv; ++e)
          r.o[(t * H + h) * Dv + e] += pr * v[(sp * Hk + g) * Dv + e];
      }
    }
  return r;
}

// Dense causal index table over documents given by cumulative offsets: row t lists start..t.
inline DVec causal_index_table(const std::vector<int64_t>& offsets, int64_t kmax) {
  const int64_t T = offsets.back();
  DVec idx(static_cast<size_t>(T * kmax), -1.0);
  for (size_t d = 0; d + 1 < offsets.size(); ++d)
    for (int64_t t = offsets[d]; t < offsets[d + 1]; ++t)
      for (int64_t s = offsets[d]; s <= t; ++s)
        idx[t * kmax + (s - offsets[d])] = static_cast<double>(s);
  return idx;
}

}  // namespace mt::ref
