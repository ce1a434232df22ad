// FSDP units (ZeRO-3 semantics) for the parameters of a Model, as UnitHooks.
//
// Each unit (embedding, each layer, the head) keeps two flat shards on this rank: its trainable
// dense parameters (whose gradient and optimizer shards share that layout) and its frozen dense
// parameters (values only: no gradient memory), sharded over the world. A layer's routed experts
// (the rank's EP slice) may form a second part with the same two groups, sharded over the
// expert-data-parallel group (the replicas holding the same experts): gathered with the layer,
// prefetched with it, reduce-scattered over that group. Buffers (the router bias) stay whole:
// they are tiny and updated outside the optimizer.
//
// Schedule per unit, forward:  gather (all-gather both shards into the unit's value buffer),
// bind the store's Params to non-owning views of it, compute, free the buffer for the next unit.
// Backward: gather again, bind the gradients to the zeroed unit gradient buffer, compute, post
// the reduce-scatter of that buffer, free the values; the reduction completes at the next unit's
// end (so it overlaps that unit's backward) and is added into the gradient shard.
// Prefetch: the next unit's gathers are posted before the current unit computes.
//
// Buffers, planned once (the constructor), so that a step after warm-up allocates nothing: per
// part, two value buffers, two unit gradient buffers and two reduce-scatter pieces, buffer
// u % 2 serving unit u. The schedule only ever holds a unit with one neighbour (the prefetch; the
// reduction in flight), whose parity differs; each buffer is sized for the largest unit, and a
// unit's buffers sit at the same address in every step. The layers are therefore bound once to
// views of them (Model::rebind_unit, which builds name tables) and again only after someone
// else rebound the unit (Model::unit_binds: gather_to_store, a device move).
//
// Every buffer is a tensor on the model's device and every value view a rows() view of one, so
// the same code runs on host memory over MPI and on a GPU over NCCL (where a collective is
// stream-ordered: wait() makes the compute stream wait, the host does not block).
//
// Overlap uses nonblocking MPI collectives on the calling thread, not a communication thread:
// the runtime is initialised without MPI_THREAD_MULTIPLE guarantees, and a thread would need a
// second communicator per group plus locking for every collective the step issues. Without
// MPI's own progress thread a nonblocking collective advances only inside MPI calls, so every
// hook first tests (MPI_Test) all requests in flight: progress happens at each unit boundary and
// during the expert exchanges' own MPI calls. The world communicator is used by this thread
// only, and every rank posts the same collectives in the same order.
//
// Between its uses a unit's Params hold undefined tensors in the store (stray reads fail loudly)
// and its layer holds views of buffers that other units reuse, which it must not read;
// gather_to_store() restores full values for callers outside a step (comparisons, export).
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "core/arena.h"
#include "model/model.h"
#include "parallel/comm.h"

namespace mt::par {

struct FsdpUnitSpec {
  std::vector<Param*> train;   // trainable dense parameters, store order: the gradient layout
  std::vector<Param*> frozen;  // frozen dense parameters (values only)
  // The unit's routed experts (this rank's EP slice), sharded over the expert-data-parallel
  // group instead of the world: ZeRO-3 for expert weights (DistOptions::shard_expert_weights).
  std::vector<Param*> expert_train, expert_frozen;
};

// Which communicator a unit's shards live on: the dense parameters over the world, the routed
// experts over the EDP replicas that hold the same experts.
enum class FsdpPart { Dense = 0, Experts = 1 };

struct FsdpMemory {
  int64_t shard_bytes = 0;         // persistent value shards (trainable + frozen)
  int64_t grad_bytes = 0;          // persistent gradient shards
  int64_t expert_shard_bytes = 0;  // of which the experts' value shards
  // The step's buffers (value gathers, unit gradients, reduce-scatter pieces), allocated once.
  int64_t buffer_bytes = 0;
  // Units whose values are gathered (or in flight), and unit gradient buffers of one part (bound
  // or being reduced), at once: the schedule keeps each at most 2 (current + prefetch; current +
  // one reduction in flight), which the buffers' parity relies on.
  int live_units = 0, live_units_peak = 0, live_grads_peak = 0;
  int live_grads[2] = {0, 0};
};

class Fsdp final : public UnitHooks {
 public:
  // Shards the units' current values (rank r of a part's communicator keeps elements
  // [r * shard, (r + 1) * shard) of each zero-padded flat buffer), frees the full tensors and
  // installs itself as the model's hooks. units[u] is model unit u. `experts` (the EDP group) is
  // needed only when a unit lists expert parameters. Shards and buffers live on `device` (the
  // model's; the communicators move that memory). Collective-free: every rank of a group starts
  // from the same values.
  Fsdp(Model& model, Comm& dense, Comm* experts, std::vector<FsdpUnitSpec> units,
       Device device = Device::CPU);
  ~Fsdp() override;
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  // The context the hooks' ops (gradient accumulation) run on: the step's, set by the trainer
  // before each forward/backward and optimizer step (the hooks' signatures carry none).
  void set_context(Context* ctx) { ctx_ = ctx; }

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

  // Trainable value shard and gradient shard of a unit's part: [shard] with shard = padded /
  // group size, padded = trainable elements rounded up to a multiple of the group size.
  Tensor& train_shard(int unit, FsdpPart part = FsdpPart::Dense) {
    return at(unit, part).train.shard;
  }
  Tensor& grad_shard(int unit, FsdpPart part = FsdpPart::Dense) {
    return at(unit, part).grad_shard;
  }
  bool owns(const Param* p) const;
  // The shape this rank's tensor of a sharded Param has when gathered (local experts: the
  // rank's slice).
  const Shape& local_shape(const Param* p) const;
  void zero_grad();
  // Completes every pending reduction and frees every gathered buffer (end of a step).
  void finish();
  // All-gathers every unit into full owning tensors in the store (collective).
  void gather_to_store();
  // Calls fn for each piece of a sharded Param this rank holds: elements [begin, begin +
  // piece.numel()) of the flattened (local) parameter are `piece`, a 1-D view of the shard (on
  // the shards' device).
  void for_each_piece(const std::function<void(Param&, int64_t begin, Tensor piece)>& fn);
  const FsdpMemory& memory() const { return mem_; }

 private:
  struct Group {
    std::vector<Param*> params;
    std::vector<Shape> shapes;  // gathered shape of each param
    int64_t n = 0, padded = 0, shard_len = 0;
    int64_t offset = 0;  // of the group in its part's value buffer (train first, then frozen)
    Tensor shard;
    Request req;
  };
  struct Part {
    Comm* comm = nullptr;
    Group train, frozen;
    Tensor grad_shard;
    bool grad_bound = false;  // its unit gradient buffer is bound (backward), not yet reduced
  };
  enum class State { Free, InFlight, Ready };
  struct Unit {
    Part parts[2];
    State state = State::Free;
    int64_t binds = -1;  // Model::unit_binds when its layers were bound to the buffers
  };
  // One part's buffers of one parity; `*_owner` is the unit using them (-1: free). A freed
  // buffer hands its host pages back (Arena::discard; device memory stays allocated), so that
  // between uses it is not resident and the step's peak stays what a fresh allocation per unit
  // gave.
  struct Buffers {
    Arena values_mem, grad_mem;
    Tensor values;  // [train.padded + frozen.padded] of the largest unit
    Tensor grad;    // [train.padded]
    Tensor piece;   // [train.shard_len]: this rank's reduce-scattered share of `grad`
    int value_owner = -1, grad_owner = -1;
  };
  struct Pending {
    int unit = 0, part = 0;
    Request req;
  };

  Part& at(int unit, FsdpPart part) {
    return units_.at(static_cast<size_t>(unit)).parts[static_cast<int>(part)];
  }
  Buffers& buffers(int unit, int part) { return buffers_[part][unit % 2]; }
  void plan_buffers();
  // Binds the layers of unit u to views of its buffers (allocates: outside the steady state).
  void bind_layers(int u);
  void start_gather(int u);
  void bind(int u, bool backward);
  // Frees the unit's buffers (a gradient buffer handed to a reduction stays its) and, release
  // only, empties its Params in the store.
  void release(int u);
  void free_buffers(int u);
  void complete_front();
  void poke();

  Model& model_;
  Device device_;
  Context* ctx_ = nullptr;
  std::vector<Unit> units_;
  Buffers buffers_[2][2];  // [part][unit parity]
  // Reductions in flight, oldest first: at most two units' parts (reserved, so never grown).
  std::vector<Pending> pending_;
  std::unordered_map<const Param*, Shape> shapes_;
  FsdpMemory mem_;
};

}  // namespace mt::par
