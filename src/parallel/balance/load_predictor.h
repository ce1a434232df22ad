// Predict (docs/load-balancing.md): per-layer, per-expert load history and a next-step forecast.
//
// Each step the caller hands in the (token, slot) pairs every expert received. The predictor keeps
// an exponential moving average (slow, stable) and a short window (fast: follows a drifting hot
// set). The forecast is their mean; a rank's forecast is the sum over the experts it holds. An
// expert (rank) is a predicted hot spot when its forecast exceeds hot_factor times the mean.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::balance {

struct PredictorOptions {
  double ema_alpha = 0.2;   // weight of the newest step in the EMA
  int64_t window = 8;       // steps in the short window
  double hot_factor = 2.0;  // forecast / mean above which an expert or rank is flagged
};

class LoadPredictor {
 public:
  // expert_rank[e]: the EP rank holding expert e (ranks = 1 + max).
  LoadPredictor(int64_t layers, std::vector<int32_t> expert_rank, const PredictorOptions& opt);

  void observe(int64_t layer, const std::vector<int64_t>& load);
  int64_t steps_seen(int64_t layer) const;

  const std::vector<double>& ema(int64_t layer) const;
  std::vector<double> window_mean(int64_t layer) const;
  // Expected pairs per expert next step (zeros before the first observation).
  std::vector<double> forecast(int64_t layer) const;
  std::vector<double> rank_forecast(int64_t layer) const;
  std::vector<char> hot_experts(int64_t layer) const;
  std::vector<char> hot_ranks(int64_t layer) const;
  // max / mean of the rank forecast (1 before any observation).
  double predicted_rank_imbalance(int64_t layer) const;

  // The layout changed (placement): rank forecasts follow the new map; history stays per expert.
  void set_expert_rank(std::vector<int32_t> expert_rank);
  // One layer's own layout (training places each MoE layer separately); same number of ranks.
  void set_expert_rank(int64_t layer, std::vector<int32_t> expert_rank);
  int64_t experts() const { return static_cast<int64_t>(expert_rank_.size()); }
  int64_t ranks() const { return ranks_; }

 private:
  struct Layer {
    std::vector<double> ema;
    std::vector<std::vector<int64_t>> ring;  // last `window` loads
    int64_t seen = 0;
    std::vector<int32_t> rank;  // this layer's layout; empty: expert_rank_
  };
  const Layer& layer(int64_t i) const;
  std::vector<int32_t> expert_rank_;
  int64_t ranks_ = 0;
  PredictorOptions opt_;
  std::vector<Layer> layers_;
};

// Compensate: the all-to-all chunk count that minimises the modeled time of the rank predicted to
// be the slowest. a2a_s / compute_s: its modeled exchange and expert time for the whole step,
// latency_s: fixed cost of one all-to-all. Time with C chunks (pipelined exchange and compute):
//   t(C) = (a + c) / C + (C - 1) / C * max(a, c) + C * latency
int chunks_for_forecast(double a2a_s, double compute_s, double latency_s, int max_chunks);
double pipelined_time(double a2a_s, double compute_s, double latency_s, int chunks);

}  // namespace mt::balance
