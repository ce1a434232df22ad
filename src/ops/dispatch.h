// The device rule of every op entry, written once: all defined tensors of a call live on one
// device, and that device picks the implementation (ops/cpu/ or ops/cuda/). An entry validates
// shapes and params, then dispatches:
//
//   if (op_device("rmsnorm_forward", {&x, &w, &y, &rstd}) == Device::CUDA) {
//   #if MOETRAIN_WITH_CUDA
//     return cuda::rmsnorm_forward(ctx, p, x, w, y, rstd);
//   #else
//     no_cuda_backend("rmsnorm_forward");
//   #endif
//   }
//   cpu::rmsnorm_forward(ctx, p, x, w, y, rstd);
#pragma once

#include <initializer_list>
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
// Thrown, in a CUDA binary, by an entry whose kernel has not landed yet (its ops/cuda/X.h declares
// the signature; the commit that adds ops/cuda/X.cu replaces this call with the cuda:: one).
[[noreturn]] void no_cuda_kernel(const char* op);

}  // namespace mt::ops
