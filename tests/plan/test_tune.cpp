// The auto-tuner's search (plan/tune.h): the space's enumeration and its parse errors, the
// Gaussian process against closed-form two-point formulas, the expected improvement against
// numerical integration, and Bayesian optimisation against random search on a grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "harness/seed.h"
#include "plan/tune.h"

namespace mt::plan {
namespace {

TEST(TuneSpace, EnumeratesEveryCombinationLastDimensionFastest) {
  const TuneSpace s = parse_tune_space("run.threads=1,2,4; train.recompute=none,full;");
  ASSERT_EQ(s.dims.size(), 2u);
  EXPECT_EQ(s.size(), 6);
  EXPECT_EQ(s.at(3), (std::vector<int>{1, 1}));
  EXPECT_EQ(s.overrides(3), (std::vector<std::string>{"run.threads=2", "train.recompute=full"}));
  for (int64_t i = 0; i < s.size(); ++i) EXPECT_EQ(s.index_of(s.at(i)), i);
  EXPECT_EQ(s.coordinates(5), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(s.coordinates(2), (std::vector<double>{0.5, 0.0}));
  const TuneSpace one = parse_tune_space("train.batch=2");
  EXPECT_EQ(one.size(), 1);
  EXPECT_EQ(one.coordinates(0), std::vector<double>{0.0});
}

TEST(TuneSpace, BadSpecsNameTheirPart) {
  const auto fails = [](const std::string& spec, const std::string& says) {
    try {
      parse_tune_space(spec, 100);
      ADD_FAILURE() << spec << ": no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << spec << ": " << e.what();
    }
  };
  fails("", "names no setting");
  fails("run.threads", "'run.threads' is not key=value");
  fails("=1,2", "is not key=value");
  fails("a=1,,2", "'a' has an empty value");
  fails("a=", "'a' has no values");
  fails("a=1;a=2", "key 'a' appears twice");
  fails("a=1,2,3,4,5,6,7,8,9,10;b=1,2,3,4,5,6,7,8,9,10,11", "110 combinations");
}

// The posterior of two points, written out with the 2 x 2 inverse: mean k*^T K^-1 z and variance
// 1 - k*^T K^-1 k* on the standardised targets z, the log marginal likelihood -z^T K^-1 z / 2 -
// log det K / 2 - log 2 pi.
TEST(GaussianProcess, TwoPointsMatchTheClosedForm) {
  const double l = 0.4, noise = 0.01;
  const std::vector<std::vector<double>> x = {{0.0, 0.2}, {0.5, 0.1}};
  const std::vector<double> y = {1.0, 3.0};
  GaussianProcess gp;
  gp.fit(x, y, l, noise);
  const auto k = [&](const std::vector<double>& a, const std::vector<double>& b) {
    const double d2 = (a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]);
    return std::exp(-d2 / (2 * l * l));
  };
  const double a11 = 1 + noise, a22 = 1 + noise, a12 = k(x[0], x[1]);
  const double det = a11 * a22 - a12 * a12;
  const double i11 = a22 / det, i22 = a11 / det, i12 = -a12 / det;
  const double z1 = -1, z2 = 1, mean = 2, sd = 1;  // y standardised: mean 2, spread 1
  for (const std::vector<double>& at :
       {std::vector<double>{0.3, 0.3}, {0.0, 0.2}, {1.0, 1.0}, {0.25, 0.15}}) {
    const double k1 = k(x[0], at), k2 = k(x[1], at);
    const double m = k1 * (i11 * z1 + i12 * z2) + k2 * (i12 * z1 + i22 * z2);
    const double v = 1 - (k1 * (i11 * k1 + i12 * k2) + k2 * (i12 * k1 + i22 * k2));
    double got_m = 0, got_sd = 0;
    gp.predict(at, got_m, got_sd);
    EXPECT_NEAR(got_m, mean + sd * m, 1e-12);
    EXPECT_NEAR(got_sd, sd * std::sqrt(v), 1e-9);
  }
  const double quad = z1 * (i11 * z1 + i12 * z2) + z2 * (i12 * z1 + i22 * z2);
  EXPECT_NEAR(gp.log_marginal_likelihood(), -0.5 * quad - 0.5 * std::log(det) - std::log(2 * M_PI),
              1e-12);
}

TEST(GaussianProcess, FitPicksTheMostLikelyGridPair) {
  Rng rng(test::test_seed());
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (int i = 0; i < 7; ++i) {
    x.push_back({rng.uniform(), rng.uniform()});
    y.push_back(std::sin(3 * x.back()[0]) + x.back()[1] * x.back()[1]);
  }
  GaussianProcess best;
  best.fit(x, y);
  for (double l : GaussianProcess::kLengths)
    for (double n : GaussianProcess::kNoises) {
      GaussianProcess gp;
      gp.fit(x, y, l, n);
      EXPECT_LE(gp.log_marginal_likelihood(), best.log_marginal_likelihood() + 1e-12)
          << "length " << l << ", noise " << n;
    }
}

// E[max(best - xi - Y, 0)], Y ~ N(mean, sd^2), by Simpson's rule over +-12 sd.
double ei_by_integration(double mean, double sd, double best, double xi) {
  const int n = 200000;
  const double a = mean - 12 * sd, b = mean + 12 * sd, h = (b - a) / n;
  double s = 0;
  for (int i = 0; i <= n; ++i) {
    const double y = a + i * h;
    const double f = std::max(best - xi - y, 0.0) *
                     std::exp(-0.5 * (y - mean) * (y - mean) / (sd * sd)) /
                     (sd * std::sqrt(2 * M_PI));
    s += f * (i == 0 || i == n ? 1 : i % 2 ? 4 : 2);
  }
  return s * h / 3;
}

TEST(ExpectedImprovement, MatchesNumericalIntegration) {
  for (const auto& [mean, sd, best, xi] :
       std::vector<std::tuple<double, double, double, double>>{{0.0, 1.0, 0.0, 0.0},
                                                               {1.0, 0.5, 0.2, 0.01},
                                                               {-0.3, 0.05, 0.0, 0.0},
                                                               {2.0, 0.3, 0.0, 0.1}})
    EXPECT_NEAR(expected_improvement(mean, sd, best, xi), ei_by_integration(mean, sd, best, xi),
                1e-9)
        << mean << " " << sd << " " << best << " " << xi;
  EXPECT_EQ(expected_improvement(1.0, 0.0, 3.0, 0.5), 1.5);  // certain: the gain itself
  EXPECT_EQ(expected_improvement(4.0, 0.0, 3.0, 0.5), 0.0);
}

// A smooth bowl over an 8 x 8 grid, its minimum at one grid point: the number of measurements
// Bayesian optimisation needs to reach it, against random search's 32.5 on average (the
// minimum's expected place in a random order of 64).
int trials_to_minimum(uint64_t seed) {
  const TuneSpace s = parse_tune_space("a=0,1,2,3,4,5,6,7;b=0,1,2,3,4,5,6,7");
  const auto f = [&](int64_t i) {
    const std::vector<double> c = s.coordinates(i);
    return (c[0] - 0.3) * (c[0] - 0.3) + 2 * (c[1] - 0.7) * (c[1] - 0.7);
  };
  int64_t argmin = 0;
  for (int64_t i = 1; i < s.size(); ++i)
    if (f(i) < f(argmin)) argmin = i;
  std::vector<std::vector<double>> c;
  for (int64_t i = 0; i < s.size(); ++i) c.push_back(s.coordinates(i));
  BayesOpt bo(c, seed, 3);
  for (int t = 1; t <= 64; ++t) {
    const int i = bo.next();
    if (i < 0) return 65;
    bo.observe(i, f(i));
    if (i == argmin) return t;
  }
  return 65;
}

TEST(BayesOpt, FindsTheMinimumOfABowlFarSoonerThanRandomSearch) {
  const uint64_t base = test::test_seed();
  int total = 0, worst = 0;
  for (uint64_t k = 0; k < 10; ++k) {
    const int t = trials_to_minimum(base + k);
    total += t;
    worst = std::max(worst, t);
  }
  EXPECT_LE(total / 10.0, 12.0) << "mean trials to the minimum (random search: 32.5)";
  EXPECT_LE(worst, 20);
}

TEST(BayesOpt, InfeasibleCandidatesAreNotProposedAgainNorBest) {
  BayesOpt bo({{0.0}, {0.5}, {1.0}}, test::test_seed(), 0);
  bo.observe(1, std::nan(""));
  bo.observe(0, 2.0);
  EXPECT_EQ(bo.best(), 0);
  EXPECT_EQ(bo.best_value(), 2.0);
  EXPECT_EQ(bo.next(), 2);  // the one left
  bo.observe(2, 1.0);
  EXPECT_EQ(bo.best(), 2);
  EXPECT_EQ(bo.next(), -1);
  EXPECT_THROW(bo.observe(2, 0.5), ValueError);
}

TEST(BayesOpt, StopsWhenNothingIsExpectedToGain) {
  // Four equal measurements at the corners: the model expects no change anywhere.
  const TuneSpace s = parse_tune_space("a=0,1,2,3,4;b=0,1,2,3,4");
  std::vector<std::vector<double>> c;
  for (int64_t i = 0; i < s.size(); ++i) c.push_back(s.coordinates(i));
  BayesOpt bo(c, test::test_seed(), 0);
  for (int i : {0, 4, 20, 24}) bo.observe(i, 1.0);
  EXPECT_EQ(bo.next(0.005), -1);
  EXPECT_LT(bo.last_gain(), 0.005);
  EXPECT_GE(bo.next(0.0), 0);  // without a threshold it still proposes an untried point
}

}  // namespace
}  // namespace mt::plan
