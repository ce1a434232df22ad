// Mesh: how the processes of a job split the work.
//   world = replicas x ep. Rank r = replica * ep + ep_rank.
//   EP group  (ep ranks, one replica): each holds num_experts / ep routed experts; tokens travel
//             between them by all-to-all.
//   EDP group (replicas ranks, one ep_rank): hold the same experts; their expert gradients are
//             summed (all-reduce, or reduce-scatter when shard_experts splits the expert optimizer
//             state and update across them).
//   Dense (non-expert) parameters are sharded over the whole world (FSDP / ZeRO).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace mt::par {

struct MeshOptions {
  int ep = 1;                         // expert-parallel size
  bool shard_experts = false;         // also shard expert optimizer state over the EDP replicas
  bool shard_expert_weights = false;  // and the expert weights and gradients (ZeRO-3)
};

struct Mesh {
  int world = 1, rank = 0;
  int ep = 1, replicas = 1;
  int ep_rank = 0, replica = 0;
  bool shard_experts = false, shard_expert_weights = false;
  int64_t num_experts = 0, local_experts = 0;
  int64_t first_expert() const { return ep_rank * local_experts; }
  // One line per group, for the start-of-run banner.
  std::string describe() const;
};

// Validates before anything is allocated: ep must be positive and divide both the world and the
// expert count (ConfigError naming the numbers otherwise). num_experts 0 = a model without MoE.
Mesh make_mesh(int world, int rank, int64_t num_experts, const MeshOptions& opt);

// The communicators of a mesh, split from the world communicator (collective over the world).
struct ProcessGroups {
  Comm* world = nullptr;      // not owned
  std::unique_ptr<Comm> ep;   // ranks of one replica
  std::unique_ptr<Comm> edp;  // ranks holding the same experts
};
ProcessGroups make_groups(Comm& world, const Mesh& mesh);

}  // namespace mt::par
