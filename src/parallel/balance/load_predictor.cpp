#include "parallel/balance/load_predictor.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace mt::balance {

LoadPredictor::LoadPredictor(int64_t layers, std::vector<int32_t> expert_rank,
                             const PredictorOptions& opt)
    : opt_(opt) {
  MT_CHECK(layers > 0, ValueError, "load predictor for ", layers, " layers");
  MT_CHECK(opt.ema_alpha > 0 && opt.ema_alpha <= 1, ValueError, "ema_alpha ", opt.ema_alpha,
           " outside (0, 1]");
  MT_CHECK(opt.window > 0, ValueError, "predictor window ", opt.window);
  set_expert_rank(std::move(expert_rank));
  layers_.resize(static_cast<size_t>(layers));
  for (Layer& l : layers_) l.ema.assign(expert_rank_.size(), 0.0);
}

void LoadPredictor::set_expert_rank(std::vector<int32_t> expert_rank) {
  MT_CHECK(!expert_rank.empty(), ValueError, "load predictor without experts");
  MT_CHECK(layers_.empty() || expert_rank.size() == expert_rank_.size(), ShapeError,
           "new layout has ", expert_rank.size(), " experts, expected ", expert_rank_.size());
  int64_t P = 0;
  for (int32_t r : expert_rank) {
    MT_CHECK(r >= 0, ValueError, "negative EP rank ", r);
    P = std::max<int64_t>(P, r + 1);
  }
  expert_rank_ = std::move(expert_rank);
  ranks_ = P;
}

const LoadPredictor::Layer& LoadPredictor::layer(int64_t i) const {
  MT_CHECK(i >= 0 && i < static_cast<int64_t>(layers_.size()), ValueError, "layer ", i, " of ",
           layers_.size());
  return layers_[static_cast<size_t>(i)];
}

void LoadPredictor::observe(int64_t i, const std::vector<int64_t>& load) {
  layer(i);
  Layer& l = layers_[static_cast<size_t>(i)];
  MT_CHECK(load.size() == expert_rank_.size(), ShapeError, "expert load has ", load.size(),
           " entries, expected ", expert_rank_.size());
  // The first observation seeds the EMA so early forecasts are not biased towards zero.
  const double a = l.seen == 0 ? 1.0 : opt_.ema_alpha;
  for (size_t e = 0; e < load.size(); ++e)
    l.ema[e] = (1 - a) * l.ema[e] + a * static_cast<double>(load[e]);
  if (static_cast<int64_t>(l.ring.size()) < opt_.window)
    l.ring.push_back(load);
  else
    l.ring[static_cast<size_t>(l.seen % opt_.window)] = load;
  ++l.seen;
}

int64_t LoadPredictor::steps_seen(int64_t i) const {
  return layer(i).seen;
}
const std::vector<double>& LoadPredictor::ema(int64_t i) const {
  return layer(i).ema;
}

std::vector<double> LoadPredictor::window_mean(int64_t i) const {
  const Layer& l = layer(i);
  std::vector<double> m(expert_rank_.size(), 0.0);
  for (const auto& v : l.ring)
    for (size_t e = 0; e < m.size(); ++e) m[e] += static_cast<double>(v[e]);
  if (!l.ring.empty())
    for (double& x : m) x /= static_cast<double>(l.ring.size());
  return m;
}

std::vector<double> LoadPredictor::forecast(int64_t i) const {
  std::vector<double> f = window_mean(i);
  const auto& ema = layer(i).ema;
  for (size_t e = 0; e < f.size(); ++e) f[e] = 0.5 * (f[e] + ema[e]);
  return f;
}

void LoadPredictor::set_expert_rank(int64_t i, std::vector<int32_t> expert_rank) {
  MT_CHECK(expert_rank.size() == expert_rank_.size(), ShapeError, "new layout of layer ", i,
           " has ", expert_rank.size(), " experts, expected ", expert_rank_.size());
  for (int32_t r : expert_rank)
    MT_CHECK(r >= 0 && r < ranks_, ValueError, "EP rank ", r, " of ", ranks_);
  layers_.at(static_cast<size_t>(i)).rank = std::move(expert_rank);
}

std::vector<double> LoadPredictor::rank_forecast(int64_t i) const {
  const std::vector<double> f = forecast(i);
  const std::vector<int32_t>& own = layer(i).rank;
  const std::vector<int32_t>& er = own.empty() ? expert_rank_ : own;
  std::vector<double> r(static_cast<size_t>(ranks_), 0.0);
  for (size_t e = 0; e < f.size(); ++e) r[static_cast<size_t>(er[e])] += f[e];
  return r;
}

namespace {
std::vector<char> above(const std::vector<double>& v, double factor) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  std::vector<char> h(v.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) h[i] = mean > 0 && v[i] > factor * mean;
  return h;
}
}  // namespace

std::vector<char> LoadPredictor::hot_experts(int64_t i) const {
  return above(forecast(i), opt_.hot_factor);
}
std::vector<char> LoadPredictor::hot_ranks(int64_t i) const {
  return above(rank_forecast(i), opt_.hot_factor);
}

double LoadPredictor::predicted_rank_imbalance(int64_t i) const {
  const std::vector<double> r = rank_forecast(i);
  const double mean = std::accumulate(r.begin(), r.end(), 0.0) / static_cast<double>(r.size());
  return mean > 0 ? *std::max_element(r.begin(), r.end()) / mean : 1.0;
}

double pipelined_time(double a2a_s, double compute_s, double latency_s, int chunks) {
  const double C = chunks;
  return (a2a_s + compute_s) / C + (C - 1) / C * std::max(a2a_s, compute_s) + C * latency_s;
}

int chunks_for_forecast(double a2a_s, double compute_s, double latency_s, int max_chunks) {
  MT_CHECK(max_chunks >= 1, ValueError, "max_chunks ", max_chunks);
  int best = 1;
  for (int c = 2; c <= max_chunks; ++c)
    if (pipelined_time(a2a_s, compute_s, latency_s, c) <
        pipelined_time(a2a_s, compute_s, latency_s, best))
      best = c;
  return best;
}

}  // namespace mt::balance
