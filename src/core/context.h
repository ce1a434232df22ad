// Context: everything an op may need from its surroundings, passed explicitly. CUDA streams,
// cuBLAS handles and communicators join it later; nothing here is process-global.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/arena.h"
#include "core/rng.h"

namespace mt {

struct ContextOptions {
  Device device = Device::CPU;
  int threads = 0;  // 0: all hardware threads
  uint64_t seed = 1234;
  size_t workspace_bytes = size_t(256) << 20;  // scratch for ops, released per op
};

class Context {
 public:
  explicit Context(const ContextOptions& opt = {});

  Device device() const { return device_; }
  int threads() const { return threads_; }
  Rng& rng() { return rng_; }
  // Scratch memory; an op takes what it needs inside an ArenaScope and gives it back on return.
  Arena& workspace() { return workspace_; }

 private:
  Device device_;
  int threads_;
  Rng rng_;
  Arena workspace_;
};

}  // namespace mt
