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
  Selective,  // FFN / MoE internals recomputed; the mixer's (attention / KDA) activations kept
  Full,       // only each block's input kept; the whole block is recomputed in backward
};
const char* recompute_name(Recompute r);
// "none" | "selective" | "full"; ValueError otherwise.
Recompute parse_recompute(const std::string& s);

// Which engine the plan is sized for. The two differ in what a rank holds between uses:
enum class Engine {
  // Ideal FSDP (GPU plans): dense weights, gradients and optimizer state sharded over `fsdp`
  // ranks, one unit gathered at a time; experts partitioned by EP and sharded by expert_shard.
  Fsdp,
  // moetrain's distributed CPU engine as it is (src/parallel/dist_trainer.h): every rank keeps
  // full dense weights and full gradient buffers; only AdamW state is sharded (dense over the
  // world; experts over EP, and over the replicas with shard_experts = expert_shard == replicas).
  // The optimizer step packs every unit's gradient into a flat buffer at once.
  Zero1Ep,
  // The distributed CPU engine with `parallel.fsdp = true` (src/parallel/fsdp.h): dense values,
  // gradients and AdamW state sharded over the world in flat units, at most two units gathered
  // (current + prefetch) and two unit gradients alive; buffers (router bias) stay whole; experts
  // whole on their EP rank, or with expert_shard = replicas ZeRO-3 over the replicas too
  // (parallel.shard_expert_weights: values, gradients and state as shards, a layer's experts
  // gathered with its unit).
  FsdpEp,
};
const char* engine_name(Engine e);  // "fsdp" | "zero1+ep" | "fsdp+ep"
// "fsdp" | "zero1+ep" | "fsdp+ep"; ValueError otherwise.
Engine parse_engine(const std::string& s);

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
  Engine engine = Engine::Fsdp;

  int64_t tokens() const { return mbs * seq; }
  int64_t experts_per_rank(int64_t num_experts) const { return num_experts / ep; }
  nlohmann::json to_json() const;
};

}  // namespace mt::plan
