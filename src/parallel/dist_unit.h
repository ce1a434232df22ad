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
  // The reduced gradient: [shard] when sharded, else [padded]. A view of its bucket's reduced
  // buffer (planned once, DistTrainer's constructor), or of the Fsdp gradient shard during an
  // fsdp unit's step.
  Tensor gshard;
  Request req;
  int model_unit = -1;  // the Model unit of a dense unit (0 embedding, 1 + i layer i, last head)
  // Non-fsdp units: the model unit after whose backward every gradient of the unit is final
  // (backward runs the units from the head down, so the lowest unit among its parameters'), its
  // bucket and its first column there (see Bucket).
  int final_after = 0, bucket = -1;
  int64_t col = 0;
  int fsdp = -1;  // model unit whose Fsdp shards hold this unit's values and gradients
  FsdpPart part = FsdpPart::Dense;  // which of that unit's parts (experts: over the EDP group)
};

// Gradient reductions of the non-fsdp units, grouped so that each is one collective posted as
// soon as backward has finished every unit in it (DistOptions::bucket_mib). A sharded bucket's
// flat buffer is [group size][cols]: unit j's flat gradient (padded to a multiple of the group
// size) is cut into rows of its shard length and placed in columns [col_j, col_j + shard_j) of
// every row, so that the reduce-scatter leaves each rank row rank() = every unit's own shard, the
// same elements as a reduce-scatter per unit. Unsharded buckets (all-reduce) concatenate.
struct DistTrainer::Bucket {
  Comm* comm = nullptr;
  bool sharded = true;
  std::vector<Unit*> units;  // in posting (backward) order
  int64_t cols = 0;          // sharded: sum of the units' shards; else sum of their padded sizes
  int ready_after = 0;       // the model unit after whose backward all its gradients are final
  Tensor flat;               // [rows x cols], zero padding written once
  Tensor reduced;            // sharded: [cols], this rank's row; else flat itself
  Request req;
  bool posted = false;
};

// The model's unit hooks while buckets exist: every hook first lets the requests in flight
// progress (MPI advances nonblocking collectives only inside its calls) and forwards to Fsdp's
// hooks when there are any; after a unit's backward it posts the buckets that unit completes.
struct DistTrainer::BucketHooks final : UnitHooks {
  BucketHooks(DistTrainer& t, UnitHooks* next) : trainer(t), inner(next) {}
  void before_forward(int u) override;
  void after_forward(int u) override;
  void before_backward(int u) override;
  void after_backward(int u) override;
  void poke();
  DistTrainer& trainer;
  UnitHooks* inner;
};

}  // namespace mt::par
