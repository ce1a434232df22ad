// What a CUDA context owns: the device, its stream and the cuBLASLt handle with its workspace and
// plan cache. Created by Context for Device::CUDA; kernels reach them through cuda_resources(ctx).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "core/cuda/lt_cache.h"

namespace mt {

class Context;

// One GEMM shape's cuBLASLt plan (ops/cuda/blas.cu builds it): descriptors initialised in place
// (the semi-opaque forms, which own nothing and need no destroy) and the heuristic's algorithm.
struct LtPlan {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, c;  // cuBLAS's column-major A, B and C (= D)
  cublasLtMatmulAlgo_t algo;
};

struct CudaResources {
  int device = 0;
  cudaStream_t stream = nullptr;  // blocking: ordered with the legacy default stream
  cublasLtHandle_t lt = nullptr;
  // cuBLAS proper, for its grouped GEMM (one call for every expert of a projection); it shares
  // cuBLASLt's workspace (both run in order on `stream`).
  cublasHandle_t blas = nullptr;
  void* lt_workspace = nullptr;  // cuBLASLt's scratch, allocated once
  size_t lt_workspace_bytes = 0;
  LtPlanCache<LtPlan> lt_plans{4096};  // ~0.5 KiB a plan
  int multiprocessors = 0;

  explicit CudaResources(int device_id);
  ~CudaResources();
  CudaResources(const CudaResources&) = delete;
  CudaResources& operator=(const CudaResources&) = delete;
};

// The context's CUDA resources; InternalError when the context is not a CUDA one.
CudaResources& cuda_resources(Context& ctx);

}  // namespace mt
