// The auto-tuner's search: Bayesian optimisation over a finite grid of settings (docs/planner.md,
// "Auto-tuner"). Each setting is a point of [0, 1]^D (a dimension's values in the order given,
// evenly spaced); a Gaussian process over the log of what was measured predicts the untried
// points, and the next one to measure is the one of largest expected improvement. Measuring is
// the caller's (train/tune.h runs real training steps); this part only decides what to measure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"

namespace mt::plan {

// One knob and the values to try, as a job's `--set key=value` takes them.
struct TuneDim {
  std::string key;
  std::vector<std::string> values;
};

// Every combination of the dimensions' values, enumerated with the last dimension fastest.
struct TuneSpace {
  std::vector<TuneDim> dims;
  int64_t size() const;
  // The value index of each dimension at `index` (0 .. size() - 1).
  std::vector<int> at(int64_t index) const;
  // The index of a combination of value indices.
  int64_t index_of(const std::vector<int>& values) const;
  // `index`'s coordinates in [0, 1]^D (a one-value dimension sits at 0).
  std::vector<double> coordinates(int64_t index) const;
  // "key=value" for each dimension at `index`.
  std::vector<std::string> overrides(int64_t index) const;
};

// "a.b=1,2,4;c=x,y": dimensions separated by ';', values by ','. ConfigError naming the part on
// an empty key, no values, an empty value, a repeated key or more than `max_size` combinations.
TuneSpace parse_tune_space(const std::string& spec, int64_t max_size = 4096);

// Gaussian-process regression with a squared-exponential kernel of unit signal variance, k(a, b)
// = exp(-|a - b|^2 / (2 l^2)), and noise variance `noise` on the diagonal, over standardised
// targets (the mean and spread of those given are taken out, and put back in predict).
class GaussianProcess {
 public:
  // Fits with this length scale and noise.
  void fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y, double length,
           double noise);
  // Fits with the (length, noise) pair of the grids below that maximises the log marginal
  // likelihood of the standardised targets.
  void fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y);
  // The posterior mean and standard deviation at `at`, in the targets' units.
  void predict(const std::vector<double>& at, double& mean, double& sd) const;
  // The log marginal likelihood of the standardised targets under the fitted hyperparameters.
  double log_marginal_likelihood() const { return lml_; }
  double length() const { return length_; }
  double noise() const { return noise_; }
  double y_scale() const { return scale_; }

  static constexpr double kLengths[] = {0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2.0};
  static constexpr double kNoises[] = {1e-6, 1e-3, 1e-2, 1e-1};

 private:
  double kernel(const std::vector<double>& a, const std::vector<double>& b) const;
  std::vector<std::vector<double>> x_;
  std::vector<double> chol_;   // lower triangle of K + noise I, row-major n x n
  std::vector<double> alpha_;  // (K + noise I)^-1 y, y standardised
  double length_ = 0.3, noise_ = 1e-3, offset_ = 0, scale_ = 1, lml_ = 0;
};

// Expected improvement below `best` of a normal prediction (mean, sd), minimising, with margin
// `xi`: E[max(best - xi - Y, 0)].
double expected_improvement(double mean, double sd, double best, double xi);

// Bayesian optimisation over `candidates` (points of [0, 1]^D), minimising what observe() is
// given. The first `initial` choices are random (after any the caller observed first), the rest
// maximise the expected improvement of a Gaussian process refitted after each observation.
class BayesOpt {
 public:
  BayesOpt(std::vector<std::vector<double>> candidates, uint64_t seed, int initial);
  // The next candidate to measure, or -1 when every candidate has been tried or, past the random
  // start, no untried one is expected to improve on the best by more than `min_gain` (relative
  // to the spread of the targets' predictions: see expected_improvement's units).
  int next(double min_gain = 0);
  // The measured value of `index` (minimised); a NaN or infinite value marks it infeasible: it is
  // never proposed again and takes no part in the fit.
  void observe(int index, double value);
  // The best feasible candidate so far (-1: none), and its value.
  int best() const;
  double best_value() const;
  // The largest expected improvement of the last next() that used the model (0 before any).
  double last_gain() const { return last_gain_; }
  bool tried(int index) const { return tried_[static_cast<size_t>(index)]; }

 private:
  std::vector<std::vector<double>> candidates_;
  std::vector<bool> tried_;
  std::vector<int> seen_;
  std::vector<double> values_;
  Rng rng_;
  int random_left_;
  double last_gain_ = 0;
};

}  // namespace mt::plan
