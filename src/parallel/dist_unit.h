// DistTrainer's optimizer unit, shared by the files that make up the trainer: dist_trainer.cpp
// (setup, forward/backward), dist_zero_step.cpp (the ZeRO optimizer step), dist_router_bias.cpp
// (aux-loss-free bias updates), dist_placement.cpp (moving experts), dist_checkpoint.cpp
// (sharded checkpoint pieces). Internal to src/parallel.
#pragma once

#include <string>
#include <vector>

#include "parallel/dist_trainer.h"
#include "parallel/fsdp.h"

namespace mt::par {

struct DistTrainer::Unit {
  std::string name;
  std::vector<Param*> params;  // trainable only: frozen ones cost no gradient or state memory
  Comm* comm = nullptr;
  bool sharded = true;      // reduce-scatter + shard update + all-gather; else all-reduce
  bool counts_norm = true;  // replicated units add their norm on one replica only
  int64_t n = 0, padded = 0, shard = 0;
  Tensor m, v;  // optimizer moments: [shard] when sharded, else [n]
  // Planned once (DistTrainer's constructor), reused by every step: gflat [padded] packs the
  // gradients, gshard is the reduced shard ([shard], or gflat itself when not sharded; a view of
  // the Fsdp gradient shard during an fsdp unit's step).
  Tensor gflat, gshard;
  Request req;
  int model_unit = -1;  // the Model unit of a dense unit (0 embedding, 1 + i layer i, last head)
  int fsdp = -1;        // model unit whose Fsdp shards hold this unit's values and gradients
  FsdpPart part = FsdpPart::Dense;  // which of that unit's parts (experts: over the EDP group)
};

}  // namespace mt::par
