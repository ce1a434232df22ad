// Checks for every CUDA runtime and cuBLAS call: a failure throws CudaError with file:line, the
// call and the library's own message. Included only by CUDA-enabled translation units.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace mt {

class CudaError : public Error {
 public:
  CudaError(const char* file, int line, const std::string& msg)
      : Error("CudaError", file, line, msg) {}
};

}  // namespace mt

#define MT_CUDA_CHECK(call)                                                        \
  do {                                                                             \
    const cudaError_t mt_rc_ = (call);                                             \
    if (mt_rc_ != cudaSuccess)                                                     \
      throw ::mt::CudaError(__FILE__, __LINE__,                                    \
                            ::mt::cat(#call, ": ", cudaGetErrorName(mt_rc_), " (", \
                                      cudaGetErrorString(mt_rc_), ")"));           \
  } while (0)

#define MT_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                           \
    const cublasStatus_t mt_st_ = (call);                                                        \
    if (mt_st_ != CUBLAS_STATUS_SUCCESS)                                                         \
      throw ::mt::CudaError(__FILE__, __LINE__,                                                  \
                            ::mt::cat(#call, ": cuBLAS status ", static_cast<int>(mt_st_), " (", \
                                      cublasLtGetStatusString(mt_st_), ")"));                    \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define MT_CUDA_LAUNCH_CHECK() MT_CUDA_CHECK(cudaGetLastError())
