// Context: everything an op may need from its surroundings, passed explicitly: the device, its
// stream and BLAS handles (CUDA), threads, RNG and the workspace. Nothing here is process-global.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/arena.h"
#include "core/rng.h"

namespace mt {

struct CudaResources;  // core/cuda/resources.h; opaque here so core/ needs no CUDA headers

struct ContextOptions {
  Device device = Device::CPU;
  int device_id = 0;  // which GPU, for Device::CUDA
  int threads = 0;    // 0: all hardware threads
  uint64_t seed = 1234;
  size_t workspace_bytes = size_t(256) << 20;  // scratch for ops, released per op
  // Bit-repeatable GPU runs: kernels avoid atomics whose order varies (costs speed).
  bool deterministic = false;
};

class Context {
 public:
  explicit Context(const ContextOptions& opt = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  int device_id() const { return device_id_; }
  int threads() const { return threads_; }
  // The thread count a context made with ContextOptions::threads = `requested` runs (0: all
  // hardware threads), for plans sized before the context exists (per-thread scratch).
  static int resolved_threads(int requested);
  bool deterministic() const { return deterministic_; }
  Rng& rng() { return rng_; }
  // Scratch memory on the context's device; an op takes what it needs inside an ArenaScope and
  // gives it back on return.
  Arena& workspace() { return workspace_; }
  // Stream, cuBLASLt handle and device properties; null for a CPU context.
  CudaResources* cuda() { return cuda_.get(); }
  // Waits for the device's queued work (a no-op on the CPU). Call sites are the documented
  // synchronisation points of a step.
  void synchronize();
  // One line for logs: "cpu (8 threads)" or "cuda:0 NVIDIA H200, 139.5 of 139.8 GiB free".
  std::string describe() const;

 private:
  Device device_;
  int device_id_;
  int threads_;
  bool deterministic_;
  Rng rng_;
  std::unique_ptr<CudaResources> cuda_;  // before the workspace: freed after it
  Arena workspace_;
};

}  // namespace mt
