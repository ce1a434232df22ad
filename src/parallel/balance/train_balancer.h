// Load balancing inside a training run (docs/load-balancing.md, "In training"): the job's
// [balance] switches applied to a model. One instance per process; every rank of a mesh holds
// one and calls the collective members together.
//
//   overflow    the bounded overflow policy on every MoeLayer (EP layout: contiguous experts)
//   predict     a LoadPredictor fed with each step's (global) per-expert loads
//   compensate  the all-to-all chunk count of the next step from the forecast of the hottest rank
//   trace       every MoE layer's top-(k + candidates) lists written as a routing trace
//   skew        a test device: adds `skew_bias` to the selection bias of chosen experts at start,
//               to make them hot on purpose (measured comparisons need a skewed router)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ops/overflow_route.h"
#include "parallel/balance/load_predictor.h"

namespace mt {
class Model;
namespace par {
class Comm;
}
}  // namespace mt

namespace mt::balance {

class TraceWriter;

struct BalanceOptions {
  // Adjust: bounded overflow rerouting (ops/overflow_route.h).
  bool overflow = false;
  double capacity = 1.25;        // expert capacity, factor of the mean expert load
  double rank_capacity = 0;      // EP-rank capacity, factor of the mean rank load; 0: none
  int64_t candidates = 2;        // m: extra candidates per token beyond top-k
  double reroute_budget = 0.05;  // max share of (token, slot) pairs rerouted per forward
  // Predict.
  bool predict = false;
  double ema_alpha = 0.2;
  int64_t window = 8;
  // Compensate: chunks in [1, max_chunks] from the forecast, with this link model of one rank.
  bool compensate = false;
  int64_t max_chunks = 8;
  double link_gbs = 5;     // GB/s per rank and direction
  double gflops = 20;      // expert GFLOP/s per rank
  double latency_us = 50;  // fixed cost of one all-to-all
  // Placement: every placement_every optimizer steps, greedy packing of each MoE layer's
  // forecast onto the EP ranks; experts move with their weights and optimizer state (implies the
  // predictor).
  bool placement = false;
  int64_t placement_every = 0;
  // Trace recording ("" = off): rank 0 writes all ranks' tokens.
  std::string trace;
  // Skewed router for measurements.
  std::vector<int64_t> skew_experts;
  double skew_bias = 0;

  bool any() const {
    return overflow || predict || compensate || placement || !trace.empty() ||
           !skew_experts.empty();
  }
};

class TrainBalancer {
 public:
  // ep_ranks: the EP group size (1 in one process). world: the mesh's processes (null: one).
  // Sets the overflow policy and the skew on every MoE layer of `model`.
  TrainBalancer(const BalanceOptions& opt, Model& model, int64_t ep_ranks, par::Comm* world);
  ~TrainBalancer();
  TrainBalancer(const TrainBalancer&) = delete;
  TrainBalancer& operator=(const TrainBalancer&) = delete;

  // After each micro-batch's forward/backward: accumulates rerouting statistics and writes the
  // trace (collective when tracing on a mesh).
  void after_forward(int64_t step);
  // After the optimizer step, with its per-layer loads (summed over the mesh; indexed by the
  // model layer, empty for dense layers). Returns the chunk count for the next step (0: leave
  // the configured count).
  int after_step(const std::vector<std::vector<int64_t>>& loads);
  // Adds "balance": {rerouted_share, shed_share, forecast_imbalance, chunks} and resets the
  // accumulated counters. Collective on a mesh.
  void add_metrics(nlohmann::json& line);
  // After after_step, at the checkpoint-safe point between optimizer steps: when placement is due
  // at `step`, each MoE layer's expert -> EP rank (indexed by model layer; dense layers empty),
  // else nothing. The same on every rank (forecasts of global loads). The overflow policy and the
  // predictor switch to the new layout; the caller moves the experts (StepExecutor::place_experts).
  std::vector<std::vector<int32_t>> placement(int64_t step);

  int chunks() const { return chunks_; }
  double forecast_imbalance() const { return imbalance_; }

 private:
  BalanceOptions opt_;
  Model& model_;
  int64_t P_;
  par::Comm* world_;
  std::vector<int> moe_layer_;  // model layer index of each MoE layer
  std::unique_ptr<LoadPredictor> predictor_;
  std::unique_ptr<TraceWriter> trace_;
  int64_t width_ = 0;  // trace candidates per token
  int64_t rerouted_ = 0, shed_ = 0, pairs_ = 0;
  int chunks_ = 0;
  bool overflow_set_ = false;
  ops::OverflowParams overflow_params_;
  double imbalance_ = 1;
};

}  // namespace mt::balance
