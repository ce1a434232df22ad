// MT_HD marks a function that the CPU bodies and the CUDA kernels share: __host__ __device__
// under nvcc, nothing in a host compiler.
#pragma once

#if defined(__CUDACC__)
#define MT_HD __host__ __device__
#else
#define MT_HD
#endif
