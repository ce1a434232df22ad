#include "core/device.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#if MOETRAIN_WITH_CUDA
#include "core/cuda/check.h"
#endif

namespace mt {

namespace {

[[noreturn]] void no_cuda(const char* what) {
  MT_THROW(ValueError, what, " needs the CUDA backend, and this binary was built without it ",
           "(configure with -DMOETRAIN_CUDA=ON)");
}

}  // namespace

int cuda_device_count() {
#if MOETRAIN_WITH_CUDA
  int n = 0;
  // No driver or no GPU is "zero devices" here, not an error: callers fall back to the CPU.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

bool cuda_available() {
  return cuda_device_count() > 0;
}

void* device_alloc(size_t bytes, Device device) {
  if (device == Device::CPU) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    MT_CHECK(rounded == 0 || p != nullptr, MemoryError, "cannot allocate ", bytes,
             " bytes of host memory");
    return p;
  }
#if MOETRAIN_WITH_CUDA
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    const DeviceMemory m = device_memory();
    MT_THROW(MemoryError, "cannot allocate ", bytes, " bytes on the GPU (", m.free, " of ", m.total,
             " bytes free): ", cudaGetErrorString(rc));
  }
  return p;
#else
  no_cuda("device memory");
#endif
}

void device_free(void* p, Device device) {
  if (device == Device::CPU) {
    std::free(p);
    return;
  }
#if MOETRAIN_WITH_CUDA
  if (p) cudaFree(p);  // runs in destructors: an error here cannot be reported usefully
#endif
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if MOETRAIN_WITH_CUDA
  MT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
  no_cuda("a copy to or from the GPU");
#endif
}

void copy_rows(void* dst, size_t dst_pitch, Device dst_device, const void* src, size_t src_pitch,
               Device src_device, size_t width, size_t rows) {
  if (width == 0 || rows == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    for (size_t i = 0; i < rows; ++i)
      std::memcpy(static_cast<char*>(dst) + i * dst_pitch,
                  static_cast<const char*>(src) + i * src_pitch, width);
    return;
  }
#if MOETRAIN_WITH_CUDA
  MT_CUDA_CHECK(cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault));
#else
  no_cuda("a copy to or from the GPU");
#endif
}

void zero_bytes(void* p, Device device, size_t bytes) {
  if (bytes == 0) return;
  if (device == Device::CPU) {
    std::memset(p, 0, bytes);
    return;
  }
#if MOETRAIN_WITH_CUDA
  MT_CUDA_CHECK(cudaMemset(p, 0, bytes));
#else
  no_cuda("zeroing GPU memory");
#endif
}

DeviceMemory device_memory() {
  DeviceMemory m;
#if MOETRAIN_WITH_CUDA
  if (cuda_device_count() > 0) MT_CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
#endif
  return m;
}

std::string cuda_device_name(int device_id) {
#if MOETRAIN_WITH_CUDA
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_id));
  return prop.name;
#else
  (void)device_id;
  return {};
#endif
}

}  // namespace mt
