// What a CUDA context owns: the device, its stream and the cuBLASLt handle with its workspace.
// Created by Context for Device::CUDA; kernels reach them through cuda_resources(ctx).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace mt {

class Context;

struct CudaResources {
  int device = 0;
  cudaStream_t stream = nullptr;  // blocking: ordered with the legacy default stream
  cublasLtHandle_t lt = nullptr;
  void* lt_workspace = nullptr;  // cuBLASLt's scratch, allocated once
  size_t lt_workspace_bytes = 0;
  int multiprocessors = 0;

  explicit CudaResources(int device_id);
  ~CudaResources();
  CudaResources(const CudaResources&) = delete;
  CudaResources& operator=(const CudaResources&) = delete;
};

// The context's CUDA resources; InternalError when the context is not a CUDA one.
CudaResources& cuda_resources(Context& ctx);

}  // namespace mt
