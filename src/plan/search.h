// Strategy search: enumerate valid parallel plans, drop those over the memory limit, rank the
// rest by a step-time cost model, and say why the winner won and the others lost.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "plan/model_stats.h"

namespace mt::plan {

// Calibrated rates of one device and its links. Defaults come from the H200 measurements of
// design.md §7, converted to FLOP/s with this planner's own FLOP formulas (docs/planner.md).
struct Hardware {
  double mem_bytes = 80e9;
  int64_t gpus_per_node = 8;
  double peak_flops = 989e12;          // bf16 dense, vendor figure: the MFU denominator
  double gemm_flops = 756e12;          // measured bf16 GEMM 8192^3
  double grouped_flops = 519e12;       // torch._grouped_mm expert FFN
  double kda_flops = 20.1e12;          // fla chunk_kda fwd+bwd
  double attn_dense_flops = 443e12;    // SDPA causal fwd+bwd
  double attn_sparse_flops = 16.4e12;  // plain PyTorch DSA attention fwd+bwd
  double indexer_flops = 7.6e12;       // plain PyTorch DSA selection
  double allgather_bw = 271e9;         // intra-node bus bandwidth, bytes/s
  double reduce_scatter_bw = 267e9;
  double inter_bw = 50e9;  // per GPU across nodes (one 400 Gb/s NIC per GPU): an assumption
  double collective_latency = 20e-6;
  // All-to-all bus bandwidth inside a node by message size per rank (bytes -> bytes/s).
  std::vector<std::pair<double, double>> a2a_curve = {{8.0 * (1 << 20), 69e9},
                                                      {64.0 * (1 << 20), 235e9},
                                                      {256.0 * (1 << 20), 282e9},
                                                      {1024.0 * (1 << 20), 323e9}};
  double a2a_bw(double bytes_per_rank) const;
  nlohmann::json to_json() const;
};

struct SearchOptions {
  LoraOptions lora;  // rank 0: full fine-tuning
  int64_t seq = 4096;
  std::optional<int64_t> mbs;  // fixed, or searched over {1, 2, 4, 8}
  std::optional<int64_t> ep, fsdp, expert_shard, a2a_chunks;
  std::optional<Recompute> recompute;
  MemoryOptions memory;
  int64_t keep = 8;  // plans listed
  // Zero1Ep: the distributed CPU engine as it is; fsdp is then the world (only optimizer state
  // is sharded), expert_shard is 1 or all replicas (shard_experts) and recompute is none.
  Engine engine = Engine::Fsdp;
};

struct StepTime {
  double compute = 0;      // all FLOP work at the calibrated rates (incl. recompute)
  double a2a = 0;          // all-to-all time, total
  double a2a_exposed = 0;  // what the chunk pipeline does not hide behind expert compute
  double gather = 0;       // FSDP and expert-shard gathers + reduce-scatters (prefetched)
  double total = 0;
  nlohmann::json to_json() const;
};

struct Evaluated {
  ParallelPlan plan;
  MemoryBreakdown memory;
  StepTime time;
  double tokens_per_s = 0;
  double mfu = 0;
  std::string rejected;  // empty: fits
  nlohmann::json to_json() const;
};

struct SearchResult {
  std::vector<Evaluated> best;  // feasible, fastest first (up to keep)
  // Rejections grouped by reason, each with a count and the closest plan (least memory).
  struct Rejection {
    std::string reason;
    int64_t count = 0;
    Evaluated closest;
  };
  std::vector<Rejection> rejections;
  std::vector<std::string> notes;  // why the best won over notable alternatives
  ParamCounts counts;
  StepFlops flops;  // at the chosen recompute policy (or None when nothing fits)
  int64_t considered = 0;
  nlohmann::json to_json() const;
};

// Evaluates one plan (memory, time, throughput). Sizes are validated: ValueError naming the rule
// (ep must divide the world and the experts, ...).
Evaluated evaluate(const ModelConfig& cfg, const ParamCounts& counts,
                   const std::vector<BlockActs>& acts, const ParallelPlan& p, const Hardware& hw,
                   const SearchOptions& o);
// Checks the divisibility rules; returns an empty string or the reason the plan is invalid.
std::string invalid_reason(const ModelConfig& cfg, const ParallelPlan& p);

// `cfg` must already carry the LoRA adapters (with_lora). Throws ValueError for requests no plan
// can satisfy by construction (a fixed EP that does not divide the experts, ...).
SearchResult search(const ModelConfig& cfg, int64_t world, const Hardware& hw,
                    const SearchOptions& o);

}  // namespace mt::plan
