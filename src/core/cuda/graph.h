// The CUDA side of OpGraph (core/graph.h): stream capture into a graph, its instantiation, launch
// and release. Included only by CUDA-enabled translation units.
#pragma once

#include <functional>

#include "core/cuda/resources.h"
#include "core/graph.h"

namespace mt::cuda_graph {

struct Captured {
  cudaGraphExec_t exec = nullptr;
  GraphNodes nodes;
};

// Captures what `ops` issues on cr.stream (thread-local capture mode: this thread's calls that a
// graph cannot hold fail, other threads are left alone) and instantiates it. An exception from
// `ops` ends the capture and propagates (wrapped in a CudaError when the capture was invalidated
// by it); a capture that ends invalidated throws CudaError. Nothing is left captured on failure.
Captured capture(CudaResources& cr, const std::function<void()>& ops);
void launch(CudaResources& cr, cudaGraphExec_t exec);
// For destructors: failures are ignored.
void destroy(cudaGraphExec_t exec) noexcept;

}  // namespace mt::cuda_graph
