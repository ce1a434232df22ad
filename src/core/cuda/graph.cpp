#include "core/cuda/graph.h"

#include <vector>

#include "core/cuda/check.h"

namespace mt::cuda_graph {

namespace {

bool invalidated(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &status) != cudaSuccess) return false;
  return status == cudaStreamCaptureStatusInvalidated;
}

// Ends a capture that an exception cut short: the partial graph is dropped, and the error that
// ending an invalidated capture leaves is cleared, or the next launch check would report it.
void abandon(cudaStream_t s) noexcept {
  cudaGraph_t g = nullptr;
  (void)cudaStreamEndCapture(s, &g);
  if (g) (void)cudaGraphDestroy(g);
  (void)cudaGetLastError();
}

GraphNodes count(cudaGraph_t g) {
  size_t n = 0;
  MT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) MT_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  GraphNodes c;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t = cudaGraphNodeTypeEmpty;
    MT_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    if (t == cudaGraphNodeTypeKernel)
      ++c.kernels;
    else if (t == cudaGraphNodeTypeMemset)
      ++c.memsets;
    else if (t == cudaGraphNodeTypeMemcpy)
      ++c.memcpys;
    else
      ++c.other;
  }
  return c;
}

// The captured graph until its executable form exists (which does not need it).
struct GraphOwner {
  cudaGraph_t g = nullptr;
  GraphOwner() = default;
  GraphOwner(const GraphOwner&) = delete;
  GraphOwner& operator=(const GraphOwner&) = delete;
  ~GraphOwner() {
    if (g) (void)cudaGraphDestroy(g);
  }
};

}  // namespace

Captured capture(CudaResources& cr, const std::function<void()>& ops) {
  MT_CUDA_CHECK(cudaStreamBeginCapture(cr.stream, cudaStreamCaptureModeThreadLocal));
  try {
    ops();
  } catch (const Error& e) {
    const bool bad = invalidated(cr.stream);
    abandon(cr.stream);
    if (bad)
      throw CudaError(__FILE__, __LINE__,
                      cat("graph capture invalidated: an op inside synchronised, allocated device "
                          "memory or copied to the host, which a CUDA graph cannot hold: ",
                          e.what()));
    throw;
  } catch (...) {
    abandon(cr.stream);
    throw;
  }
  GraphOwner graph;
  const cudaError_t rc = cudaStreamEndCapture(cr.stream, &graph.g);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(__FILE__, __LINE__,
                    cat("graph capture: cudaStreamEndCapture: ", cudaGetErrorName(rc), " (",
                        cudaGetErrorString(rc),
                        "): an op inside used the stream in a way a graph cannot hold (a wait, "
                        "an allocation, a copy to the host, or work forked to another stream and "
                        "not joined back)"));
  }
  Captured c;
  c.nodes = count(graph.g);
  MT_CUDA_CHECK(cudaGraphInstantiate(&c.exec, graph.g, 0));
  // Uploaded now, so that the first replay costs what the others do.
  const cudaError_t up = cudaGraphUpload(c.exec, cr.stream);
  if (up != cudaSuccess) {
    destroy(c.exec);
    MT_CUDA_CHECK(up);
  }
  return c;
}

void launch(CudaResources& cr, cudaGraphExec_t exec) {
  MT_CUDA_CHECK(cudaGraphLaunch(exec, cr.stream));
}

void destroy(cudaGraphExec_t exec) noexcept {
  if (exec) (void)cudaGraphExecDestroy(exec);
}

}  // namespace mt::cuda_graph
