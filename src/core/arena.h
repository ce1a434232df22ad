// Arena: one block of memory sized before use, handed out by bumping an offset. Activations,
// saved tensors and scratch come from arenas whose capacity the caller computed up front (with
// ArenaPlan, the same arithmetic the arena applies), so a step never allocates on the heap and
// the planner's memory prediction is the allocation.
#pragma once

#include <cstddef>
#include <memory>

#include "core/tensor.h"

namespace mt {

constexpr size_t kArenaAlign = 64;

inline size_t arena_footprint(size_t bytes) {
  return (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

// Accumulates the footprint of a sequence of allocations. Every entry has a dtype: activations
// take the plan's activation dtype (the precision policy's, model/precision.h), the places that
// stay fp32 under every policy say so with add_fp32, and integer entries name their type. The
// device is where the arena will live: a layer may keep more for a backend's kernels there.
class ArenaPlan {
 public:
  explicit ArenaPlan(DType activations = DType::F32, Device device = Device::CPU)
      : act_(activations), device_(device) {}

  // An activation, stored in the plan's activation dtype.
  void add(const Shape& shape) { add(shape, act_); }
  void add(const Shape& shape, DType dtype) {
    bytes_ += arena_footprint(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  }
  // An entry that stays fp32 whatever the policy (statistics, recurrent state, router logits).
  void add_fp32(const Shape& shape) { add(shape, DType::F32); }
  void add_bytes(size_t bytes) { bytes_ += arena_footprint(bytes); }
  size_t bytes() const { return bytes_; }
  DType activations() const { return act_; }
  Device device() const { return device_; }

 private:
  DType act_;
  Device device_;
  size_t bytes_ = 0;
};

class Arena {
 public:
  Arena() = default;
  Arena(size_t capacity, Device device, const char* name);

  // A tensor view into the arena; throws MemoryError naming the arena when it is full.
  Tensor alloc(const Shape& shape, DType dtype = DType::F32);
  Tensor zeros(const Shape& shape, DType dtype = DType::F32);

  size_t mark() const { return used_; }
  void release(size_t mark) { used_ = mark; }
  void reset() { used_ = 0; }
  // reset(), and host pages handed back to the system while the allocation stays: the memory of
  // a dead arena stops counting as resident, and reusing it later allocates nothing.
  void discard();

  size_t capacity() const { return storage_ ? storage_->bytes : 0; }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  const char* name() const { return name_; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t used_ = 0;
  size_t peak_ = 0;
  const char* name_ = "arena";
};

// Releases everything allocated from `arena` inside the scope when the scope ends.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& arena) : arena_(arena), mark_(arena.mark()) {}
  ~ArenaScope() { arena_.release(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& arena_;
  size_t mark_;
};

}  // namespace mt
