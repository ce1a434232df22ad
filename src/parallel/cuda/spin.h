// A kernel that holds a stream for a given time: the simulated peer delay of
// CommOptions::simulated_us, enqueued before a collective on its stream (CUDA builds only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mt::par {

// Enqueues one single-thread kernel on `stream` that returns `us` microseconds after it starts
// (the GPU's global timer); it occupies one SM slot, not the SM.
void spin_on_stream(cudaStream_t stream, int64_t us);

}  // namespace mt::par
