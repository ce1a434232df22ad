// Double-precision reference of LM head + softmax cross-entropy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

struct CrossEntropyOut {
  double loss = 0;  // mean over tokens whose target is not ignore_index
  DVec lse;         // per token, 0 where ignored
};

inline CrossEntropyOut lm_head_cross_entropy(const DVec& h, const DVec& w, const DVec& targets,
                                             int64_t hidden, int64_t vocab, int ignore_index) {
  const int64_t tokens = static_cast<int64_t>(targets.size());
  CrossEntropyOut o{0.0, DVec(static_cast<size_t>(tokens), 0.0)};
  int64_t counted = 0;
  DVec z(static_cast<size_t>(vocab));
  for (int64_t t = 0; t < tokens; ++t) {
    const int tgt = static_cast<int>(targets[t]);
    if (tgt == ignore_index) continue;
    for (int64_t v = 0; v < vocab; ++v) {
      double s = 0;
      for (int64_t k = 0; k < hidden; ++k) s += h[t * hidden + k] * w[v * hidden + k];
      z[v] = s;
    }
    const double top = *std::max_element(z.begin(), z.end());
    double se = 0;
    for (double zv : z) se += std::exp(zv - top);
    o.lse[t] = top + std::log(se);
    o.loss += o.lse[t] - z[tgt];
    ++counted;
  }
  if (counted) o.loss /= static_cast<double>(counted);
  return o;
}

}  // namespace mt::ref
