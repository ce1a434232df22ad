#include "core/cuda/resources.h"

#include "core/context.h"
#include "core/cuda/check.h"

namespace mt {

namespace {
// Enough for cuBLASLt's split-K and stream-K heuristics on Hopper (NVIDIA recommends 32 MiB).
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
}  // namespace

CudaResources::CudaResources(int device_id) : device(device_id) {
  MT_CUDA_CHECK(cudaSetDevice(device));
  // A blocking stream on purpose: the plain copies and memsets of core/device.h (Tensor::zeros,
  // read_scalar, set-up copies) run on the legacy default stream, which is then ordered with
  // this stream's kernels both ways. A non-blocking stream let read_scalar read a loss before
  // the kernel writing it had finished (seen under compute-sanitizer).
  MT_CUDA_CHECK(cudaStreamCreate(&stream));
  MT_CUBLAS_CHECK(cublasLtCreate(&lt));
  lt_workspace_bytes = kLtWorkspaceBytes;
  MT_CUDA_CHECK(cudaMalloc(&lt_workspace, lt_workspace_bytes));
  MT_CUBLAS_CHECK(cublasCreate(&blas));
  MT_CUBLAS_CHECK(cublasSetStream(blas, stream));
  MT_CUBLAS_CHECK(cublasSetWorkspace(blas, lt_workspace, lt_workspace_bytes));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
}

CudaResources::~CudaResources() {
  // Destructors cannot report: release what exists and ignore failures of a dying context.
  if (stream) cudaStreamSynchronize(stream);
  if (lt_workspace) cudaFree(lt_workspace);
  if (blas) cublasDestroy(blas);
  if (lt) cublasLtDestroy(lt);
  if (stream) cudaStreamDestroy(stream);
}

CudaResources& cuda_resources(Context& ctx) {
  MT_CHECK(ctx.cuda() != nullptr, InternalError, "CUDA kernel called with a ",
           device_name(ctx.device()), " context");
  return *ctx.cuda();
}

}  // namespace mt
