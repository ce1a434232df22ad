// Double-precision references of the row normalisations over the last dimension.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace mt::ref {

using DVec = std::vector<double>;

struct NormOut {
  DVec y, mean, rstd;
};

inline NormOut rmsnorm(const DVec& x, const DVec& w, int64_t rows, int64_t dim, double eps) {
  NormOut o{DVec(x.size()), {}, DVec(static_cast<size_t>(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t d = 0; d < dim; ++d) ms += x[r * dim + d] * x[r * dim + d];
    ms /= static_cast<double>(dim);
    const double inv = 1.0 / std::sqrt(ms + eps);
    o.rstd[r] = inv;
    for (int64_t d = 0; d < dim; ++d) o.y[r * dim + d] = x[r * dim + d] * inv * w[d];
  }
  return o;
}

inline NormOut layernorm(const DVec& x, const DVec& w, const DVec& b, int64_t rows, int64_t dim,
                         double eps) {
  NormOut o{DVec(x.size()), DVec(static_cast<size_t>(rows)), DVec(static_cast<size_t>(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0;
    for (int64_t d = 0; d < dim; ++d) mu += x[r * dim + d];
    mu /= static_cast<double>(dim);
    double var = 0;
    for (int64_t d = 0; d < dim; ++d) var += (x[r * dim + d] - mu) * (x[r * dim + d] - mu);
    var /= static_cast<double>(dim);
    const double inv = 1.0 / std::sqrt(var + eps);
    o.mean[r] = mu;
    o.rstd[r] = inv;
    for (int64_t d = 0; d < dim; ++d) o.y[r * dim + d] = (x[r * dim + d] - mu) * inv * w[d] + b[d];
  }
  return o;
}

// y = x / sqrt(sum x^2 + eps).
inline NormOut l2norm(const DVec& x, int64_t rows, int64_t dim, double eps) {
  NormOut o{DVec(x.size()), {}, DVec(static_cast<size_t>(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += x[r * dim + d] * x[r * dim + d];
    const double inv = 1.0 / std::sqrt(ss + eps);
    o.rstd[r] = inv;
    for (int64_t d = 0; d < dim; ++d) o.y[r * dim + d] = x[r * dim + d] * inv;
  }
  return o;
}

}  // namespace mt::ref
