// Double-precision scalar AdamW, written from the paper's update (decoupled weight decay).
#pragma once

#include <cmath>
#include <cstdint>

namespace mt::ref {

struct AdamWState {
  double param = 0, m = 0, v = 0;
};

inline void adamw(AdamWState& s, double grad, double lr, double beta1, double beta2, double eps,
                  double wd, int64_t step) {
  const double decayed = s.param - lr * wd * s.param;
  s.m = beta1 * s.m + (1 - beta1) * grad;
  s.v = beta2 * s.v + (1 - beta2) * grad * grad;
  const double mhat = s.m / (1 - std::pow(beta1, static_cast<double>(step)));
  const double vhat = s.v / (1 - std::pow(beta2, static_cast<double>(step)));
  s.param = decayed - lr * mhat / (std::sqrt(vhat) + eps);
}

}  // namespace mt::ref
