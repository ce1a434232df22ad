// The parallel-plan IR: what the planner decides and what the trainer and the distributed engine
// consume. Plain data with no dependency on src/parallel or src/train, so either side can evolve
// without the other; `to_json` is the exchange format (`moetrain plan --json`).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace mt::plan {

// What backward recomputes instead of keeping from forward.
enum class Recompute {
  None,       // every activation forward saves stays until backward (the CPU engine today)
  Selective,  // mixer (attention / KDA) internals recomputed; FFN/MoE activations kept
  Full,       // only each block's input kept; the whole block is recomputed in backward
};
const char* recompute_name(Recompute r);
// "none" | "selective" | "full"; ValueError otherwise.
Recompute parse_recompute(const std::string& s);

struct ParallelPlan {
  int64_t world = 1;          // ranks
  int64_t gpus_per_node = 8;  // decides which links a collective crosses
  int64_t fsdp = 1;           // shard group of dense (non-expert) parameters; = world (ZeRO-3)
  int64_t ep = 1;             // expert-parallel group; ep | world and ep | num_experts
  int64_t replicas = 1;       // expert-data-parallel replicas = world / ep
  int64_t expert_shard = 1;   // experts FSDP-sharded across this many replicas (divides replicas)
  int64_t mbs = 1;            // sequences per micro-batch per rank
  int64_t seq = 4096;         // tokens per sequence
  Recompute recompute = Recompute::None;
  int64_t a2a_chunks = 1;  // all-to-all split into chunks pipelined with expert compute

  int64_t tokens() const { return mbs * seq; }
  int64_t experts_per_rank(int64_t num_experts) const { return num_experts / ep; }
  nlohmann::json to_json() const;
};

}  // namespace mt::plan
