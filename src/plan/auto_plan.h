// `moetrain train --plan auto`: the planner sizes the distributed CPU engine as it is (zero1+ep,
// or fsdp+ep when only that fits) for the world a job runs on and chooses ep, a2a_chunks,
// shard_experts (fsdp+ep: the expert weights too), the recompute policy and the per-rank
// micro-batch under a per-rank memory limit. Pure planning: no dependency on the trainer, which
// applies the result to its job.
#pragma once

#include <cstdint>
#include <string>

#include "plan/search.h"

namespace mt::plan {

struct AutoRequest {
  ModelConfig cfg;  // with the job's LoRA adapters applied
  bool freeze_base = false;
  int64_t world = 1;
  int64_t seq = 0;         // tokens per packed sequence
  int64_t batch = 1;       // sequences per micro-batch over all ranks (train.batch)
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  double mem_bytes = 0;    // per rank
  std::string mem_source;  // where the limit came from, for the explanation
  bool fsdp = false;       // the job asks for parallel.fsdp: plan that engine only
};

struct AutoPlan {
  Evaluated chosen;  // the plan with its predicted memory and time
  int64_t ep = 1, a2a_chunks = 1;
  bool shard_experts = false;
  bool shard_expert_weights = false;  // fsdp+ep with expert_shard > 1: experts ZeRO-3 too
  bool fsdp = false;                  // the fsdp+ep engine (parallel.fsdp): zero1+ep does not fit
  Recompute recompute = Recompute::None;  // the faster plans recompute only when memory needs it
  int64_t batch = 1, grad_accum = 1;      // batch x grad_accum equals the request's
  std::string explanation;                // what was chosen and why, several lines
};

// A plan as the keys of a job (`moetrain train` runs it as it is), or why the engine cannot run
// it. The engine shards dense parameters over all ranks (parallel.fsdp) or keeps them whole
// with the optimizer state sharded (zero1), and shards expert state, or with FSDP the expert
// weights too (ZeRO-3), over all expert replicas or none.
struct PlanJob {
  int64_t ep = 1, a2a_chunks = 1, world = 1;
  int64_t batch = 1;  // train.batch: micro-batch sequences per rank x world
  bool fsdp = false, shard_experts = false, shard_expert_weights = false;
  Recompute recompute = Recompute::None;
  std::string unsupported;  // empty when the engine runs the plan
  // "--set parallel.ep=32 --set ..." (the [parallel] keys, train.recompute and train.batch).
  std::string set_args() const;
};
PlanJob plan_job(const ParallelPlan& p);

// The CPU host as the step-time model sees it. The rates only rank plans against each other
// (EP's exchange against replicated experts); they are rough, uncalibrated assumptions.
Hardware cpu_host(double mem_bytes);

// Largest per-rank micro-batch (at most the job's batch / world) whose best plan fits; ties
// between plans go to the faster, then the smaller. At each micro-batch zero1+ep (no gathers) is
// tried first, then, on more than one rank, fsdp+ep (dense state sharded over the world).
// ConfigError when the sizes cannot split over the world, or with the planner's rejections when
// nothing fits.
AutoPlan choose_auto_plan(const AutoRequest& r);

// Physical memory of this host in bytes (0 when unknown).
double host_memory_bytes();

}  // namespace mt::plan
