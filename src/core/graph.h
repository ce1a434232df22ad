// OpGraph: a sequence of ops issued on a Context's stream, captured once and replayed as one
// launch (a CUDA graph on a GPU). What it saves is the host's work per op (validation, plan
// lookups, the launches themselves) and the gaps between kernels that it leaves on the device;
// `moetrain bench moe` measures it for the grouped experts (docs/gpu.md, "CUDA graphs").
//
// What a replay runs is fixed at capture: the kernels, their launch shapes and every value the
// host computed from data (the grouped GEMMs' problem sizes come from the dispatch plan's host
// copy of the offsets, so a graph replays one routing only), and the addresses of every tensor,
// the workspace's scratch included. New data goes into the same buffers between replays; a
// replay must not find the workspace filled beyond where capture found it (checked: the graph's
// scratch would overlap live tensors).
//
// A capture fails when an op inside synchronises, allocates device memory or copies to the
// host (none of which a graph can hold): the op's own error propagates, wrapped in a CudaError
// that says the capture was invalidated; the stream is left out of capture and the graph empty.
//
// On a CPU context there is no stream to capture: capture() keeps the function (running
// nothing) and each replay() calls it, so code written for graphs runs unchanged; nodes() is
// then all zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/context.h"

namespace mt {

// The nodes of a captured graph by kind: kernels are the launches one replay makes.
struct GraphNodes {
  int64_t kernels = 0, memsets = 0, memcpys = 0, other = 0;
  int64_t total() const { return kernels + memsets + memcpys + other; }
};

class OpGraph {
 public:
  OpGraph() = default;
  ~OpGraph();
  OpGraph(OpGraph&& o) noexcept;
  OpGraph& operator=(OpGraph&& o) noexcept;
  OpGraph(const OpGraph&) = delete;
  OpGraph& operator=(const OpGraph&) = delete;

  // Records what `ops` issues on ctx's stream (see above), replacing an earlier capture. On a
  // GPU nothing runs until replay(). On failure the graph is left empty.
  void capture(Context& ctx, std::function<void()> ops);
  // Queues the captured work on ctx's stream (no wait on a GPU); ctx must be the context
  // (device and stream) of the capture. InternalError when nothing was captured.
  void replay(Context& ctx);

  bool captured() const { return exec_ != nullptr || static_cast<bool>(cpu_ops_); }
  const GraphNodes& nodes() const { return nodes_; }
  // Releases the graph (what the destructor does).
  void reset() noexcept;

 private:
  Context* ctx_ = nullptr;  // the capture's context, for the replay's check
  size_t workspace_mark_ = 0;
  void* exec_ = nullptr;  // cudaGraphExec_t (core/cuda/graph.h) on a GPU
  std::function<void()> cpu_ops_;
  GraphNodes nodes_;
};

}  // namespace mt
