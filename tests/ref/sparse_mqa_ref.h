// Double-precision reference of attention in the absorbed MQA form (ops/sparse_mqa_attention.h):
// one shared key row per position whose first Dv columns are the values. Used only by tests.
#pragma once

#include "ref/attention_ref.h"

namespace mt::ref {

// q [T, H, Dk], kv [T, Dk], idx [T, kmax] (< 0 or >= T unused).
inline AttnRefOut sparse_mqa(const DVec& q, const DVec& kv, const DVec& idx, int64_t T, int64_t H,
                             int64_t Dk, int64_t Dv, int64_t kmax, double scale) {
  DVec v(static_cast<size_t>(T * Dv));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < Dv; ++e) v[t * Dv + e] = kv[t * Dk + e];
  return attention(q, kv, v, idx, T, H, 1, Dk, Dv, kmax, scale);
}

}  // namespace mt::ref
