// The device rule of every op entry, written once: all defined tensors of a call live on one
// device, and that device picks the implementation (ops/cpu/ or ops/cuda/). An entry validates
// shapes and params, then dispatches:
//
//   dispatch(MT_OP_BODIES(rmsnorm_forward), {&x, &w, &y, &rstd}, ctx, p, x, w, y, rstd);
//
// or, when the host path has more to do first (checks that read values):
//
//   if (auto* cuda = cuda_body(MT_OP_BODIES(embedding_forward), {&ids, &table, &out}))
//     return cuda(ctx, p, ids, table, out);
//   check_ids(p, ids);
//   cpu::embedding_forward(ctx, p, ids, table, out);
#pragma once

#include <initializer_list>
#include <utility>
#include <vector>

#include "core/tensor.h"

#ifndef MOETRAIN_WITH_CUDA
#define MOETRAIN_WITH_CUDA 0
#endif

namespace mt::ops {

// The device of the defined tensors of `op` (CPU when none is defined); throws ValueError naming
// the op and both devices when they differ. Reads no data, so it is safe on device memory.
Device op_device(const char* op, std::initializer_list<const Tensor*> ts);
// The same rule over a list of tensors (the gradients of a parameter set).
Device op_device(const char* op, const std::vector<Tensor>& ts);

// Checks an op's loss or norm output: one f64 element (ShapeError naming `what`). Ops write such
// scalars instead of returning them, so that no op reads device memory on the host; the trainer
// reads them once a step (docs/gpu.md, "Synchronisation points").
void expect_f64_scalar(const Tensor& t, const char* what);

// Thrown by an entry that got CUDA tensors in a binary built without the CUDA backend.
[[noreturn]] void no_cuda_backend(const char* op);
// Thrown, in a CUDA binary, by an entry whose kernel has not landed yet (the entry spells out its
// CUDA branch until then; docs/contributing.md, "An op", step 4).
[[noreturn]] void no_cuda_kernel(const char* op);

// An entry's name (for errors) and its backends' bodies, all of one function type F.
template <typename F>
struct OpBodies {
  const char* name;
  F* cpu;
  F* cuda;  // null in a binary built without the CUDA backend, which declares but never defines it
};

// The bodies of entry `f`: cpu::f and, in a CUDA build, cuda::f. A macro because a CPU-only build
// must not name cuda::f at all (the link would need its definition).
#if MOETRAIN_WITH_CUDA
#define MT_CUDA_BODY(f) (&::mt::ops::cuda::f)
#else
#define MT_CUDA_BODY(f) nullptr
#endif
#define MT_OP_BODIES(f) MT_NAMED_OP_BODIES(#f, f)
// The same under another name in errors: an entry whose bodies are shared or named otherwise.
#define MT_NAMED_OP_BODIES(name, f) \
  (::mt::ops::OpBodies<decltype(::mt::ops::cpu::f)>{name, &::mt::ops::cpu::f, MT_CUDA_BODY(f)})

// The CUDA body to run when the tensors `ts` live on CUDA (no_cuda_backend when this binary has
// none); null when they live on the CPU.
template <typename F>
F* cuda_body(const OpBodies<F>& op, std::initializer_list<const Tensor*> ts) {
  if (op_device(op.name, ts) != Device::CUDA) return nullptr;
  if (!op.cuda) no_cuda_backend(op.name);
  return op.cuda;
}

// Runs the body of the tensors' device on `args`.
template <typename F, typename... Args>
decltype(auto) dispatch(const OpBodies<F>& op, std::initializer_list<const Tensor*> ts,
                        Args&&... args) {
  if (F* cuda = cuda_body(op, ts)) return cuda(std::forward<Args>(args)...);
  return op.cpu(std::forward<Args>(args)...);
}

}  // namespace mt::ops
