// Training on a mesh of processes (mpirun): the StepExecutor over par::DistTrainer, and sharded
// checkpoints.
//
// Sharded checkpoint: a directory like checkpoint.h's, with model/optimizer.safetensors replaced by
//   shard-RRRRR-of-WWWWW.safetensors  what rank R held: pieces "<name>@<begin>" of the flattened
//                                     full-model tensors (weights, "m."/"v." moments), each
//                                     element written by exactly one rank
//   index.json                        {"format": "moetrain-sharded-1", "world", "ep",
//                                      "tensors": {name: {"shape", "pieces": [{file, key, begin,
//                                      end}]}}}
// plus state.json, job.toml and manifest.json (written last by rank 0, then renamed into place).
// Tensors are addressed in single-process coordinates (experts [num_experts, ...]), so loading
// reshards to any world or EP size, and a one-process run reads it too.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"
#include "parallel/comm.h"
#include "parallel/dist_trainer.h"
#include "parallel/mesh.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/job.h"
#include "train/trainer.h"

namespace mt {

// The mesh of a job's [parallel] keys and its process groups. Validated (ConfigError) before the
// model is allocated. Collective over `world`.
struct DistSetup {
  DistSetup(par::Comm& world, const ModelConfig& cfg, const Job& job);
  // A GPU mesh: `ctx` is this rank's GPU context (device local rank % GPUs); an NCCL communicator
  // over `world` (the bootstrap, MPI) becomes the transport and the groups are split from it, so
  // the trainer's collectives move device memory. Collective over `world`.
  void use_nccl(par::Comm& world, Context& ctx, const par::CommOptions& opt);
  par::Mesh mesh;
  std::unique_ptr<par::Comm> transport;  // NCCL on a GPU mesh; null: the groups split `world`
  par::ProcessGroups groups;
  int a2a_chunks = 1;
  bool fsdp = false;
  int micro_batches = 1;  // train.grad_accum
  // Measurement knobs (docs/parallelism.md, "Measuring overlap"), from the environment: the
  // gradient bucket size (MOETRAIN_BUCKET_MIB), the experts through the exchange at EP 1
  // (MOETRAIN_EXCHANGE_AT_EP1=1); use_nccl reads MOETRAIN_SIM_COMM_US and MOETRAIN_COMM_OVERLAP.
  double bucket_mib = par::DistOptions{}.bucket_mib;
  bool exchange_at_ep1 = false;
};

// The executor of one rank; slices the model's experts to the rank's share. `weights` (optional)
// then fills the rank's slices (par::DistTrainer::load_weights): a model built with deferred
// weights is loaded without any rank holding the whole of it; `progress` hears of its reads.
std::unique_ptr<StepExecutor> make_dist_executor(Context& ctx, Model& model, DistSetup& setup,
                                                 const AdamWOptions& adam,
                                                 const par::PieceReader& weights = {},
                                                 const par::LoadProgress& progress = {});

bool is_sharded_checkpoint(const std::string& dir);
// One process reading a sharded checkpoint: full tensors assembled from the pieces.
TrainState load_sharded_checkpoint(const std::string& dir, Model& model, AdamW* opt);

}  // namespace mt
