// Device memory and copies behind one plain C++ interface, so that core/ and the tests never
// include CUDA headers. In a build without CUDA, every CUDA request is a ValueError that says so;
// `cuda_available()` is false there and when no GPU is visible.
#pragma once

#include <cstddef>
#include <string>

#include "core/dtype.h"

namespace mt {

// True when this binary has the CUDA backend and at least one GPU is visible.
bool cuda_available();
// The number of visible GPUs (0 in a build without CUDA).
int cuda_device_count();

// Raw memory on `device`: 256-byte aligned on CUDA, 64 on the CPU. Freed with device_free.
void* device_alloc(size_t bytes, Device device);
void device_free(void* p, Device device);

// Byte copies between any two devices. Copies that involve the GPU are ordered on the default
// stream and complete before returning (they are for set-up, tests and checkpoints, never for a
// training step's inner loop).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void zero_bytes(void* p, Device device, size_t bytes);
// `rows` rows of `width` bytes at the given pitches (bytes), under copy_bytes's rules.
void copy_rows(void* dst, size_t dst_pitch, Device dst_device, const void* src, size_t src_pitch,
               Device src_device, size_t width, size_t rows);

// Device memory in use and total, in bytes (cudaMemGetInfo); {0, 0} without CUDA.
struct DeviceMemory {
  size_t free = 0, total = 0;
};
DeviceMemory device_memory();
// The GPU's marketing name ("NVIDIA H200"); empty without CUDA.
std::string cuda_device_name(int device_id);

}  // namespace mt
