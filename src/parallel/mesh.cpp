#include "parallel/mesh.h"

#include <sstream>

#include "ops/moe_rules.h"

namespace mt::par {

Mesh make_mesh(int world, int rank, int64_t num_experts, const MeshOptions& opt) {
  MT_CHECK(world >= 1 && rank >= 0 && rank < world, ValueError, "rank ", rank, " of world ", world);
  const std::string ep = ops::expert_parallel_error(opt.ep, num_experts, world);
  MT_CHECK(ep.empty(), ConfigError, ep);
  Mesh m;
  m.world = world;
  m.rank = rank;
  m.ep = opt.ep;
  m.replicas = world / opt.ep;
  m.ep_rank = rank % opt.ep;
  m.replica = rank / opt.ep;
  m.shard_experts = opt.shard_experts || opt.shard_expert_weights;
  m.shard_expert_weights = opt.shard_expert_weights;
  m.num_experts = num_experts;
  m.local_experts = num_experts / opt.ep;
  return m;
}

std::string Mesh::describe() const {
  std::ostringstream os;
  os << "mesh: world " << world << " = " << replicas << " replica(s) x EP " << ep << "\n";
  os << "  dense parameters: sharded over all " << world << " ranks\n";
  for (int q = 0; q < replicas; ++q) {
    os << "  EP group " << q << ": ranks";
    for (int e = 0; e < ep; ++e) os << " " << q * ep + e;
    os << "\n";
  }
  for (int e = 0; e < ep; ++e) {
    os << "  experts [" << e * local_experts << ", " << (e + 1) * local_experts << "): ranks";
    for (int q = 0; q < replicas; ++q) os << " " << q * ep + e;
    os << (replicas <= 1          ? ""
           : shard_expert_weights ? " (weights, gradients and optimizer state sharded)"
           : shard_experts        ? " (optimizer state sharded)"
                                  : " (replicated)")
       << "\n";
  }
  return os.str();
}

ProcessGroups make_groups(Comm& world, const Mesh& mesh) {
  MT_CHECK(world.size() == mesh.world && world.rank() == mesh.rank, InternalError, "mesh for rank ",
           mesh.rank, "/", mesh.world, " used with ", world.where());
  ProcessGroups g;
  g.world = &world;
  g.ep = world.split(mesh.replica, mesh.ep_rank, "ep group");
  g.edp = world.split(mesh.ep_rank, mesh.replica, "edp group");
  return g;
}

}  // namespace mt::par
