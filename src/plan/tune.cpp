#include "plan/tune.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "core/error.h"

namespace mt::plan {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, sep);) parts.push_back(trim(p));
  if (!s.empty() && s.back() == sep) parts.push_back("");
  return parts;
}

// Cholesky factor of the n x n symmetric positive definite `a` (row-major) into its lower
// triangle; false where a pivot is not positive.
bool cholesky(std::vector<double>& a, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (size_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) return false;
    const double l = std::sqrt(d);
    a[j * n + j] = l;
    for (size_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (size_t k = 0; k < j; ++k) s -= a[i * n + k] * a[j * n + k];
      a[i * n + j] = s / l;
    }
    for (size_t k = j + 1; k < n; ++k) a[j * n + k] = 0;
  }
  return true;
}

// Solves L v = b in place (L lower triangular, row-major n x n).
void forward_solve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = 0; i < n; ++i) {
    double s = b[i];
    for (size_t k = 0; k < i; ++k) s -= l[i * n + k] * b[k];
    b[i] = s / l[i * n + i];
  }
}

// Solves L^T v = b in place.
void backward_solve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = n; i-- > 0;) {
    double s = b[i];
    for (size_t k = i + 1; k < n; ++k) s -= l[k * n + i] * b[k];
    b[i] = s / l[i * n + i];
  }
}

}  // namespace

int64_t TuneSpace::size() const {
  int64_t n = 1;
  for (const TuneDim& d : dims) n *= static_cast<int64_t>(d.values.size());
  return dims.empty() ? 0 : n;
}

std::vector<int> TuneSpace::at(int64_t index) const {
  std::vector<int> v(dims.size());
  for (size_t i = dims.size(); i-- > 0;) {
    const auto n = static_cast<int64_t>(dims[i].values.size());
    v[i] = static_cast<int>(index % n);
    index /= n;
  }
  return v;
}

int64_t TuneSpace::index_of(const std::vector<int>& values) const {
  int64_t index = 0;
  for (size_t i = 0; i < dims.size(); ++i)
    index = index * static_cast<int64_t>(dims[i].values.size()) + values[i];
  return index;
}

std::vector<double> TuneSpace::coordinates(int64_t index) const {
  const std::vector<int> v = at(index);
  std::vector<double> c(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const size_t n = dims[i].values.size();
    c[i] = n > 1 ? static_cast<double>(v[i]) / static_cast<double>(n - 1) : 0.0;
  }
  return c;
}

std::vector<std::string> TuneSpace::overrides(int64_t index) const {
  const std::vector<int> v = at(index);
  std::vector<std::string> o;
  for (size_t i = 0; i < dims.size(); ++i)
    o.push_back(dims[i].key + "=" + dims[i].values[static_cast<size_t>(v[i])]);
  return o;
}

TuneSpace parse_tune_space(const std::string& spec, int64_t max_size) {
  TuneSpace space;
  std::set<std::string> keys;
  double size = 1;
  for (const std::string& part : split(spec, ';')) {
    if (part.empty()) continue;  // "a=1,2;" ends with an empty part
    const size_t eq = part.find('=');
    MT_CHECK(eq != std::string::npos && eq > 0, ConfigError, "tune space: '", part,
             "' is not key=value,value,...");
    TuneDim d{.key = trim(part.substr(0, eq)), .values = split(part.substr(eq + 1), ',')};
    MT_CHECK(!d.key.empty(), ConfigError, "tune space: '", part, "' has no key");
    MT_CHECK(keys.insert(d.key).second, ConfigError, "tune space: key '", d.key, "' appears twice");
    for (const std::string& v : d.values)
      MT_CHECK(!v.empty(), ConfigError, "tune space: '", d.key, "' has an empty value");
    MT_CHECK(!d.values.empty(), ConfigError, "tune space: '", d.key, "' has no values");
    size *= static_cast<double>(d.values.size());
    space.dims.push_back(std::move(d));
  }
  MT_CHECK(!space.dims.empty(), ConfigError, "tune space '", spec,
           "' names no setting (expected key=value,value;key=...)");
  MT_CHECK(size <= static_cast<double>(max_size), ConfigError, "tune space: ", size,
           " combinations, more than ", max_size, "; narrow the lists");
  return space;
}

double GaussianProcess::kernel(const std::vector<double>& a, const std::vector<double>& b) const {
  double d2 = 0;
  for (size_t i = 0; i < a.size(); ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  return std::exp(-d2 / (2 * length_ * length_));
}

void GaussianProcess::fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                          double length, double noise) {
  MT_CHECK(!x.empty() && x.size() == y.size(), ValueError, "gaussian process: ", x.size(),
           " points for ", y.size(), " targets");
  MT_CHECK(length > 0 && noise > 0, ValueError, "gaussian process: length ", length, ", noise ",
           noise, " must be positive");
  x_ = x;
  length_ = length;
  noise_ = noise;
  const size_t n = x.size();
  double mean = 0;
  for (double v : y) mean += v;
  mean /= static_cast<double>(n);
  double var = 0;
  for (double v : y) var += (v - mean) * (v - mean);
  var /= static_cast<double>(n);
  offset_ = mean;
  // One point, or all equal: a vanishing spread, so that the model expects no change anywhere
  // (measurements that all agree give no reason to look further).
  scale_ = var > 0 ? std::sqrt(var) : 1e-12;
  chol_.assign(n * n, 0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) chol_[i * n + j] = kernel(x[i], x[j]) + (i == j ? noise : 0);
  // The noise keeps K + noise I positive definite; a failure means points far closer than the
  // grid's spacing with a vanishing noise: add jitter until it factors.
  for (double jitter = 1e-10; !cholesky(chol_, n); jitter *= 100) {
    MT_CHECK(jitter < 1, InternalError, "gaussian process: the kernel matrix does not factor");
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j)
        chol_[i * n + j] = kernel(x[i], x[j]) + (i == j ? noise + jitter : 0);
  }
  alpha_.resize(n);
  for (size_t i = 0; i < n; ++i) alpha_[i] = (y[i] - offset_) / scale_;
  std::vector<double> z = alpha_;
  forward_solve(chol_, n, alpha_);
  // log p(z) = -z^T alpha / 2 - sum log L_ii - n log(2 pi) / 2, alpha = (K + noise I)^-1 z.
  double quad = 0, logdet = 0;
  for (size_t i = 0; i < n; ++i) {
    quad += alpha_[i] * alpha_[i];
    logdet += std::log(chol_[i * n + i]);
  }
  lml_ = -0.5 * quad - logdet - 0.5 * static_cast<double>(n) * std::log(2 * M_PI);
  backward_solve(chol_, n, alpha_);
}

void GaussianProcess::fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y) {
  double best = -std::numeric_limits<double>::infinity(), bl = kLengths[0], bn = kNoises[0];
  for (double l : kLengths)
    for (double n : kNoises) {
      fit(x, y, l, n);
      if (lml_ > best) {
        best = lml_;
        bl = l;
        bn = n;
      }
    }
  fit(x, y, bl, bn);
}

void GaussianProcess::predict(const std::vector<double>& at, double& mean, double& sd) const {
  const size_t n = x_.size();
  std::vector<double> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = kernel(x_[i], at);
  double m = 0;
  for (size_t i = 0; i < n; ++i) m += k[i] * alpha_[i];
  forward_solve(chol_, n, k);
  double v = 1;
  for (size_t i = 0; i < n; ++i) v -= k[i] * k[i];
  mean = offset_ + scale_ * m;
  sd = scale_ * std::sqrt(std::max(v, 1e-12));
}

double expected_improvement(double mean, double sd, double best, double xi) {
  const double gain = best - xi - mean;
  if (!(sd > 0)) return std::max(gain, 0.0);
  const double z = gain / sd;
  const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
  return gain * cdf + sd * pdf;
}

BayesOpt::BayesOpt(std::vector<std::vector<double>> candidates, uint64_t seed, int initial)
    : candidates_(std::move(candidates)),
      tried_(candidates_.size(), false),
      rng_(seed),
      random_left_(initial) {
  MT_CHECK(!candidates_.empty(), ValueError, "bayesian optimisation: no candidates");
}

int BayesOpt::next(double min_gain) {
  std::vector<int> untried;
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (!tried_[i]) untried.push_back(static_cast<int>(i));
  if (untried.empty()) return -1;
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (size_t i = 0; i < seen_.size(); ++i)
    if (std::isfinite(values_[i])) {
      x.push_back(candidates_[static_cast<size_t>(seen_[i])]);
      y.push_back(values_[i]);
    }
  // Random until the start is spent, and while fewer than two feasible points say anything.
  if (random_left_ > 0 || x.size() < 2) {
    if (random_left_ > 0) --random_left_;
    return untried[static_cast<size_t>(rng_.next_u64() % untried.size())];
  }
  GaussianProcess gp;
  gp.fit(x, y);
  const double best = *std::min_element(y.begin(), y.end());
  // The margin: a hundredth of the targets' spread, so that a flat model explores.
  const double xi = 0.01 * gp.y_scale();
  int pick = untried.front();
  double top = -1;
  for (int i : untried) {
    double m = 0, sd = 0;
    gp.predict(candidates_[static_cast<size_t>(i)], m, sd);
    const double ei = expected_improvement(m, sd, best, xi);
    if (ei > top) {
      top = ei;
      pick = i;
    }
  }
  last_gain_ = top;
  return top > min_gain ? pick : -1;
}

void BayesOpt::observe(int index, double value) {
  MT_CHECK(index >= 0 && static_cast<size_t>(index) < candidates_.size(), ValueError,
           "bayesian optimisation: candidate ", index, " of ", candidates_.size());
  MT_CHECK(!tried_[static_cast<size_t>(index)], ValueError, "bayesian optimisation: candidate ",
           index, " observed twice");
  tried_[static_cast<size_t>(index)] = true;
  seen_.push_back(index);
  values_.push_back(std::isfinite(value) ? value : std::numeric_limits<double>::quiet_NaN());
}

int BayesOpt::best() const {
  int b = -1;
  double v = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < seen_.size(); ++i)
    if (std::isfinite(values_[i]) && values_[i] < v) {
      v = values_[i];
      b = seen_[i];
    }
  return b;
}

double BayesOpt::best_value() const {
  double v = std::numeric_limits<double>::infinity();
  for (double x : values_)
    if (std::isfinite(x)) v = std::min(v, x);
  return v;
}

}  // namespace mt::plan
