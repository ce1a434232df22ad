#include "core/context.h"

#include <omp.h>

#include <cstdio>

#include "core/device.h"
#if MOETRAIN_WITH_CUDA
#include "core/cuda/check.h"
#include "core/cuda/resources.h"
#endif

namespace mt {

#if !MOETRAIN_WITH_CUDA
// Without the backend a context never holds CUDA resources; the type only needs to be complete.
struct CudaResources {};
#endif

namespace {

std::unique_ptr<CudaResources> make_cuda(const ContextOptions& opt) {
  if (opt.device != Device::CUDA) return nullptr;
#if MOETRAIN_WITH_CUDA
  const int n = cuda_device_count();
  MT_CHECK(n > 0, ValueError, "a CUDA context was requested but no GPU is visible");
  MT_CHECK(opt.device_id >= 0 && opt.device_id < n, ValueError, "GPU ", opt.device_id,
           " requested, ", n, " visible");
  return std::make_unique<CudaResources>(opt.device_id);
#else
  MT_THROW(ValueError, "a CUDA context needs the CUDA backend, and this binary was built ",
           "without it (configure with -DMOETRAIN_CUDA=ON)");
#endif
}

}  // namespace

int Context::resolved_threads(int requested) {
  return requested > 0 ? requested : omp_get_max_threads();
}

Context::Context(const ContextOptions& opt)
    : device_(opt.device),
      device_id_(opt.device_id),
      threads_(resolved_threads(opt.threads)),
      deterministic_(opt.deterministic),
      rng_(opt.seed),
      cuda_(make_cuda(opt)),
      workspace_(opt.workspace_bytes, opt.device, "workspace") {
  MT_CHECK(opt.threads >= 0, ValueError, "threads must be >= 0, got ", opt.threads);
}

Context::~Context() = default;

std::string Context::describe() const {
  if (device_ == Device::CPU) return "cpu (" + std::to_string(threads_) + " threads)";
  const DeviceMemory m = device_memory();
  char buf[160];
  std::snprintf(buf, sizeof buf, "cuda:%d %s, %.1f of %.1f GiB free%s", device_id_,
                cuda_device_name(device_id_).c_str(), static_cast<double>(m.free) / (1 << 30),
                static_cast<double>(m.total) / (1 << 30), deterministic_ ? ", deterministic" : "");
  return buf;
}

void Context::synchronize() {
#if MOETRAIN_WITH_CUDA
  if (cuda_) MT_CUDA_CHECK(cudaStreamSynchronize(cuda_->stream));
#endif
}

}  // namespace mt
