#include "core/graph.h"

#include <utility>

#include "core/error.h"

#if MOETRAIN_WITH_CUDA
#include "core/cuda/graph.h"
#endif

namespace mt {

OpGraph::~OpGraph() {
  reset();
}

OpGraph::OpGraph(OpGraph&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)),
      workspace_mark_(std::exchange(o.workspace_mark_, 0)),
      exec_(std::exchange(o.exec_, nullptr)),
      cpu_ops_(std::exchange(o.cpu_ops_, nullptr)),
      nodes_(std::exchange(o.nodes_, {})) {}

OpGraph& OpGraph::operator=(OpGraph&& o) noexcept {
  if (this != &o) {
    reset();
    ctx_ = std::exchange(o.ctx_, nullptr);
    workspace_mark_ = std::exchange(o.workspace_mark_, 0);
    exec_ = std::exchange(o.exec_, nullptr);
    cpu_ops_ = std::exchange(o.cpu_ops_, nullptr);
    nodes_ = std::exchange(o.nodes_, {});
  }
  return *this;
}

void OpGraph::reset() noexcept {
#if MOETRAIN_WITH_CUDA
  cuda_graph::destroy(static_cast<cudaGraphExec_t>(exec_));
#endif
  exec_ = nullptr;
  cpu_ops_ = nullptr;
  nodes_ = {};
  ctx_ = nullptr;
  workspace_mark_ = 0;
}

void OpGraph::capture(Context& ctx, std::function<void()> ops) {
  reset();
  MT_CHECK(static_cast<bool>(ops), ValueError, "OpGraph::capture: no function to capture");
  if (ctx.device() == Device::CPU) {
    cpu_ops_ = std::move(ops);
  } else {
#if MOETRAIN_WITH_CUDA
    const cuda_graph::Captured c = cuda_graph::capture(cuda_resources(ctx), ops);
    exec_ = c.exec;
    nodes_ = c.nodes;
#else
    MT_THROW(InternalError, "OpGraph::capture: a ", device_name(ctx.device()),
             " context in a build without the CUDA backend");
#endif
  }
  ctx_ = &ctx;
  workspace_mark_ = ctx.workspace().mark();
}

void OpGraph::replay(Context& ctx) {
  MT_CHECK(captured(), InternalError, "OpGraph::replay before a capture");
  MT_CHECK(&ctx == ctx_, ValueError, "OpGraph::replay on another context than the capture's");
  MT_CHECK(ctx.workspace().mark() <= workspace_mark_, ValueError,
           "OpGraph::replay: ", ctx.workspace().mark(),
           " bytes of the workspace are in use, more than the ", workspace_mark_,
           " at capture: the captured ops' scratch would overlap tensors still alive");
  if (cpu_ops_) {
    cpu_ops_();
    return;
  }
#if MOETRAIN_WITH_CUDA
  cuda_graph::launch(cuda_resources(ctx), static_cast<cudaGraphExec_t>(exec_));
#endif
}

}  // namespace mt
