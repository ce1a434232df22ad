// FSDP units (ZeRO-3 semantics) for the dense parameters of a Model, as UnitHooks.
//
// Each unit (embedding, each layer, the head) keeps two flat shards on this rank: its trainable
// dense parameters (whose gradient and optimizer shards share that layout) and its frozen dense
// parameters (values only: no gradient memory). Expert weights and buffers (the router bias)
// are not sharded here: expert parallelism partitions the former, the latter are tiny and are
// updated outside the optimizer.
//
// Schedule per unit, forward:  gather (all-gather both shards into full-size buffers), bind the
// store's Params and the layer to non-owning views of them, compute, free the buffers.
// Backward: gather again, bind the gradients to a zeroed full-size unit gradient buffer, compute,
// post the reduce-scatter of that buffer, free the values; the reduction completes at the next
// unit's end (so it overlaps that unit's backward) and is added into the gradient shard.
// Prefetch: the next unit's gathers are posted before the current unit computes.
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
// and its layer holds dangling views that it must not read; gather_to_store() restores full
// values for callers outside a step (comparisons, export).
#pragma once

#include <deque>
#include <functional>
#include <vector>

#include "model/model.h"
#include "parallel/comm.h"

namespace mt::par {

struct FsdpUnitSpec {
  std::vector<Param*> train;   // trainable dense parameters, store order: the gradient layout
  std::vector<Param*> frozen;  // frozen dense parameters (values only)
};

struct FsdpMemory {
  int64_t shard_bytes = 0;     // persistent value shards (trainable + frozen)
  int64_t grad_bytes = 0;      // persistent gradient shards
  int64_t transient_peak = 0;  // most bytes of gather and unit-gradient buffers alive at once
  int64_t transient_now = 0;
  // Units whose values are gathered (or in flight), and unit gradient buffers (bound or being
  // reduced), at once: the schedule keeps each at most 2 (current + prefetch; current + one
  // reduction in flight).
  int live_units = 0, live_units_peak = 0, live_grads = 0, live_grads_peak = 0;
};

class Fsdp final : public UnitHooks {
 public:
  // Shards the units' current values (rank r keeps elements [r * shard, (r + 1) * shard) of
  // each zero-padded flat buffer), frees the full tensors and installs itself as the model's
  // hooks. units[u] is model unit u. Collective-free: every rank starts from the same values.
  Fsdp(Model& model, Comm& comm, std::vector<FsdpUnitSpec> units);
  ~Fsdp() override;
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

  // Trainable value shard and gradient shard of a unit: [shard] with shard = padded / world,
  // padded = trainable elements rounded up to a multiple of the world size.
  Tensor& train_shard(int unit) { return units_.at(static_cast<size_t>(unit)).train.shard; }
  Tensor& grad_shard(int unit) { return units_.at(static_cast<size_t>(unit)).grad_shard; }
  bool owns(const Param* p) const;
  void zero_grad();
  // Completes every pending reduction and frees every gathered buffer (end of a step).
  void finish();
  // All-gathers every unit into full owning tensors in the store (collective).
  void gather_to_store();
  // Calls fn for each piece of a sharded Param this rank holds: elements [begin, begin + count)
  // of the flattened parameter live at data.
  void for_each_piece(
      const std::function<void(Param&, int64_t begin, float* data, int64_t count)>& fn);
  const FsdpMemory& memory() const { return mem_; }

 private:
  struct Group {
    std::vector<Param*> params;
    int64_t n = 0, padded = 0, shard_len = 0;
    Tensor shard, full;
    Request req;
  };
  enum class State { Free, InFlight, Ready };
  struct Unit {
    Group train, frozen;
    Tensor grad_shard, grad_full;
    State state = State::Free;
  };
  struct Pending {
    int unit = 0;
    Tensor full, part;
    Request req;
  };

  void start_gather(int u);
  void bind(int u, bool backward);
  // handed_off: the unit gradient buffer went to a pending reduction, which now counts it.
  void release(int u, bool handed_off = false);
  void complete_front();
  void poke();
  void track(int64_t bytes);

  Model& model_;
  Comm& comm_;
  std::vector<Unit> units_;
  std::deque<Pending> pending_;
  FsdpMemory mem_;
};

}  // namespace mt::par
