// `moetrain simulate-routing` (docs/load-balancing.md): routing traces, synthetic (Zipf skew with
// a hot/cold ratio, drifting hot set) or replayed from a file, pushed through the balancing
// policies and a link/compute model of one MoE layer's expert-parallel exchange.
//
// Scale: the model counts `tokens_per_rank` tokens per rank per step; the simulator draws
// `sample_per_rank` of them (candidate lists) and multiplies the counts by
// tokens_per_rank / sample_per_rank, so 1000 steps at 896 experts x 128 ranks take seconds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mt::balance {

struct LinkModel {
  double bandwidth = 50e9;            // bytes/s per rank, each direction (inter-node, per device)
  double latency = 20e-6;             // seconds per all-to-all (per chunk)
  double flops = 400e12;              // effective expert FLOP/s per rank
  double bytes_per_elem = 2;          // bf16 rows
  int64_t latent = 3584, ffn = 3072;  // seed-2.8t expert shapes
};

struct SimOptions {
  int64_t experts = 896, top_k = 16, ranks = 128, ep = 64;
  int64_t tokens_per_rank = 4096, sample_per_rank = 256, steps = 1000;
  // Synthetic trace: expert popularity w_i = i^-zipf over a shuffled order; hot_cold > 0 sets
  // zipf = ln(hot_cold) / ln(E) so that w_1 / w_E = hot_cold. drift: expected swaps per step
  // of a hot expert (top 1/16 of the order) with a random one.
  double zipf = 0, hot_cold = 30, drift = 0.5;
  uint64_t seed = 1;
  std::string trace;   // replay this trace file instead (docs/load-balancing.md#trace-format)
  std::string record;  // write the synthetic candidate lists to this trace file
  // Policies.
  bool overflow = false, compensate = false, placement = false;
  int64_t extra = 8;  // m: candidates beyond top-k
  float expert_capacity = 1.5f, rank_capacity = 1.1f, max_reroute_share = 0.05f;
  int base_chunks = 1, max_chunks = 8;
  int64_t placement_every = 100;  // steps between placements (checkpoint-safe points)
  LinkModel link;
  int threads = 0;
};

struct SimStep {
  int64_t step = 0;
  double expert_max_mean = 0, rank_max_mean = 0, hot_cold = 0;
  double rerouted_share = 0, over_capacity_share = 0;
  int64_t dead_experts = 0, hot_experts = 0;
  double a2a_bytes_max = 0, a2a_bytes_mean = 0;  // per rank (dispatch + combine, sent)
  double time_max_s = 0, idle_mean_s = 0;        // modeled
  int chunks = 1;
  double forecast_err = 0;  // mean |forecast - load| / mean load over experts (before observing)
};

struct SimSummary {
  SimStep mean;  // double fields averaged over steps (integer fields: see below)
  double chunks = 0, dead_experts = 0, hot_experts = 0;  // averaged over steps
  double seconds = 0;
  int64_t steps = 0;
};

SimSummary simulate_routing(const SimOptions& opt,
                            const std::function<void(const SimStep&)>& each = {});

// The policies measured against the strongest static baseline, so that the gain of chunking and
// the gain of rerouting show separately: policies off at every fixed chunk count
// base_chunks..max_chunks, the one with the least mean modeled step time kept (a fixed setting an
// engineer could pick by hand); then forecast-driven chunking alone, rerouting alone at the
// baseline's chunk count, and both (with opt.placement, placement joins the rerouting runs).
// Every run replays the same trace (same seed or trace file); none records one.
struct PolicyComparison {
  int best_chunks = 1;     // chunk count of the strongest static baseline
  SimSummary given;        // policies off at opt.base_chunks
  SimSummary best_static;  // policies off at best_chunks
  SimSummary chunking;     // forecast-driven chunks (floor opt.base_chunks), no rerouting
  SimSummary reroute;      // overflow rerouting at best_chunks
  SimSummary both;         // rerouting + forecast-driven chunks
};
PolicyComparison compare_policies(const SimOptions& opt);

// Trace file: text, documented in docs/load-balancing.md.
//   moetrain-routing-trace 1
//   experts E top_k K width W
//   step S layer L tokens T
//   e_0 ... e_{W-1} s_0 ... s_{W-1}        (one line per token, descending score)
struct TraceStep {
  int64_t step = 0, layer = 0, tokens = 0;
  std::vector<int32_t> cand;  // [tokens, W]
  std::vector<float> score;   // [tokens, W]
};
struct TraceHeader {
  int64_t experts = 0, top_k = 0, width = 0;
};
class TraceWriter {
 public:
  TraceWriter(const std::string& path, const TraceHeader& h);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  void write(const TraceStep& s);

 private:
  struct Impl;
  Impl* impl_;
  TraceHeader h_;
};
// Reads the whole trace (IoError / ValueError naming the file and line on malformed input).
std::vector<TraceStep> read_trace(const std::string& path, TraceHeader& header);

// Placement (EPLB-like, without replicas here): experts sorted by load, each to the rank with the
// least load so far that still has a free slot (E/P slots per rank). Returns expert -> rank.
std::vector<int32_t> greedy_placement(const std::vector<double>& load, int64_t ranks);

}  // namespace mt::balance
