// Shared pieces of the CUDA ops: element loads/stores that compute in fp32 whatever the storage
// type, the dtype switch that turns a tensor's runtime dtype into a template argument, launch
// sizes and opt-in dynamic shared memory, warp and block reductions, and the lookups of packed
// documents and index-table slots.
#pragma once

#include <cuda_bf16.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/context.h"
#include "core/cuda/check.h"
#include "core/cuda/resources.h"
#include "core/tensor.h"

namespace mt::ops::cuda {

__device__ __forceinline__ float ld(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void st(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16(v);
}

// Runs the statements with `T` = float or __nv_bfloat16 after the tensor's dtype (ShapeError for
// others). A macro rather than a generic lambda because nvcc allows no __device__ lambdas inside
// generic lambdas, and the element-wise kernels are written as such lambdas.
#define MT_DISPATCH_FLOAT(tensor, op, ...)                                    \
  do {                                                                        \
    if ((tensor).dtype() == ::mt::DType::F32) {                               \
      using T = float;                                                        \
      __VA_ARGS__                                                             \
    } else if ((tensor).dtype() == ::mt::DType::BF16) {                       \
      using T = __nv_bfloat16;                                                \
      __VA_ARGS__                                                             \
    } else {                                                                  \
      MT_THROW(ShapeError, op, ": CUDA path takes f32 or bf16 tensors, got ", \
               ::mt::dtype_name((tensor).dtype()));                           \
    }                                                                         \
  } while (0)

// Every float tensor of an op that shares the element type T must have the same dtype.
inline void expect_same_dtype(const char* op, const Tensor& a, const Tensor& b, const char* what) {
  if (!b.defined() || b.numel() == 0) return;
  MT_CHECK(a.dtype() == b.dtype(), ShapeError, op, ": ", what, " is ", dtype_name(b.dtype()),
           " but the op runs in ", dtype_name(a.dtype()));
}

inline void expect_f32(const char* op, const Tensor& t, const char* what) {
  if (!t.defined() || t.numel() == 0) return;
  MT_CHECK(t.dtype() == DType::F32, ShapeError, op, ": ", what, " must be f32 (fp32 statistics ",
           "and parameter gradients), got ", dtype_name(t.dtype()));
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

inline cudaStream_t stream(Context& ctx) {
  return cuda_resources(ctx).stream;
}

inline unsigned blocks_for(int64_t n, int threads, int64_t cap = 65535LL * 32) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b < cap ? b : cap);
}

// n blocks as a grid's x dimension; ValueError past its 2^31 - 1.
inline unsigned grid_of(int64_t n, const char* op) {
  MT_CHECK(n <= 0x7fffffff, ValueError, op, ": ", n, " blocks exceed one grid");
  return static_cast<unsigned>(n);
}

// Dynamic shared memory of `bytes` for `kernel`, opting in past the default 48 KiB (ValueError
// past the device's opt-in limit).
template <typename Kernel>
size_t smem_for(Kernel kernel, size_t bytes, const char* op) {
  if (bytes > (48u << 10)) {
    int dev = 0, most = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    MT_CHECK(bytes <= static_cast<size_t>(most), ValueError, op, ": needs ", bytes,
             " bytes of shared memory per block (head dims or top-k too large), the GPU has ",
             most);
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
    // All of L1 as shared memory, so that blocks under half of it fit twice per SM.
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
  }
  return bytes;
}

// f(i) for every i < n, over a grid-stride loop: the shape of every element-wise kernel.
template <typename F>
__global__ void for_each_index_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    f(i);
}

template <typename F>
void for_each_index(Context& ctx, int64_t n, F f) {
  if (n == 0) return;
  constexpr int threads = 256;
  for_each_index_kernel<<<blocks_for(n, threads), threads, 0, stream(ctx)>>>(n, f);
  MT_CUDA_LAUNCH_CHECK();
}

// V elements of T moved as one 16-byte (or narrower) access: the element-wise kernels that are
// bound by HBM read and write whole packs where widths and addresses allow.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& x) {
  *reinterpret_cast<Pack<T, V>*>(p) = x;
}

// The sigmoid with the fast exponential (a few f32 ulp, far below bf16's), and SiLU's derivative
// applied to dy: the one formula of the activations, the sigmoid op and the short conv's SiLU.
__device__ __forceinline__ float sigm(float x) {
  return 1.f / (1.f + __expf(-x));
}
__device__ __forceinline__ float silu_grad(float x, float dy) {
  const float s = sigm(x);
  return dy * s * (1.f + x * (1.f - s));
}

// The operands of map_elements' kernel: I inputs of TI, O outputs of TO.
template <typename TI, typename TO, int I, int O>
struct MapOperands {
  const TI* in[I];
  TO* out[O];
};

// f over element e of every operand: a[i] = in[i][e] (in fp32), out[o][e] = b[o].
template <typename TI, typename TO, int I, int O, typename F>
__device__ __forceinline__ void map_element(const MapOperands<TI, TO, I, O>& p, int64_t e,
                                            const F& f) {
  float a[I], b[O];
#pragma unroll
  for (int i = 0; i < I; ++i) a[i] = ld(p.in[i], e);
  f(a, b);
#pragma unroll
  for (int o = 0; o < O; ++o) st(p.out[o], e, b[o]);
}

// Packs of V elements a thread (then the n % V left, an element a thread).
template <typename TI, typename TO, int I, int O, int V, typename F>
__global__ void map_elements_kernel(int64_t n, MapOperands<TI, TO, I, O> p, F f) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x, packs = n / V;
  for (int64_t k = first; k < packs; k += step) {
    Pack<TI, V> x[I];
#pragma unroll
    for (int i = 0; i < I; ++i) x[i] = load_pack<TI, V>(p.in[i] + k * V);
    Pack<TO, V> y[O];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float a[I], b[O];
#pragma unroll
      for (int i = 0; i < I; ++i) a[i] = ld(x[i].v, e);
      f(a, b);
#pragma unroll
      for (int o = 0; o < O; ++o) st(y[o].v, e, b[o]);
    }
#pragma unroll
    for (int o = 0; o < O; ++o) store_pack<TO, V>(p.out[o] + k * V, y[o]);
  }
  for (int64_t e = packs * V + first; e < n; e += step) map_element(p, e, f);
}

// out[o][e] = f(in[0][e] .. in[I-1][e])[o] for e < n over dense operands (an output may be an
// input too: each element is read before it is written), f(const float (&a)[I], float (&b)[O])
// in fp32. 16 bytes a thread of the wider type where every base is aligned to its pack: the
// element-wise passes are bound by HBM, and 2-byte accesses left them far from it (session 23's
// step: SiLU, add_into and sigmoid_gate through for_each_index, ~9 ms a step).
template <typename TI, typename TO, int I, int O, typename F>
void map_elements(Context& ctx, int64_t n, const std::array<const TI*, I>& in,
                  const std::array<TO*, O>& out, F f) {
  if (n == 0) return;
  constexpr int V = static_cast<int>(16 / (sizeof(TI) > sizeof(TO) ? sizeof(TI) : sizeof(TO)));
  MapOperands<TI, TO, I, O> p;
  bool packed = true;
  for (int i = 0; i < I; ++i) {
    p.in[i] = in[static_cast<size_t>(i)];
    packed = packed && reinterpret_cast<uintptr_t>(p.in[i]) % (V * sizeof(TI)) == 0;
  }
  for (int o = 0; o < O; ++o) {
    p.out[o] = out[static_cast<size_t>(o)];
    packed = packed && reinterpret_cast<uintptr_t>(p.out[o]) % (V * sizeof(TO)) == 0;
  }
  constexpr int threads = 256;
  if (packed)
    map_elements_kernel<TI, TO, I, O, V>
        <<<blocks_for((n + V - 1) / V, threads), threads, 0, stream(ctx)>>>(n, p, f);
  else
    map_elements_kernel<TI, TO, I, O, 1>
        <<<blocks_for(n, threads), threads, 0, stream(ctx)>>>(n, p, f);
  MT_CUDA_LAUNCH_CHECK();
}

// Whether rows of width w of T can move in 16-byte packs: w a whole number of packs and every
// base 16-byte aligned (the row pitches then are too).
template <typename T>
bool packs_fit(int64_t w, std::initializer_list<const void*> bases) {
  bool ok = w % (16 / static_cast<int64_t>(sizeof(T))) == 0;
  for (const void* p : bases) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return ok;
}

// f(std::integral_constant<int, V>{}) with V the 16-byte pack of T when `packed`, else 1: one
// launch site for both forms of a pack kernel.
template <typename T, typename F>
void with_pack(bool packed, const F& f) {
  if (packed)
    f(std::integral_constant<int, static_cast<int>(16 / sizeof(T))>{});
  else
    f(std::integral_constant<int, 1>{});
}

// Sum over the warp's lanes; the butterfly leaves the same bits on every lane.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// a . b over n elements by one warp; every lane gets the sum.
template <typename A, typename B>
__device__ __forceinline__ float warp_dot(const A* a, const B* b, int64_t n) {
  float s = 0.f;
  for (int64_t d = threadIdx.x & 31; d < n; d += 32) s += ld(a, d) * ld(b, d);
  return warp_sum(s);
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
// T is float or double (the reductions that accumulate in double).
template <typename T>
__device__ __forceinline__ T block_sum(T v) {
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  T s = lane < warps ? part[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// Maximum over a block, as block_sum.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  float m = lane < warps ? part[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// The document of token t in packed offsets cu [nseq + 1]: cu[i] <= t < cu[i + 1].
__device__ __forceinline__ int64_t doc_index(const int32_t* cu, int64_t nseq, int64_t t) {
  int64_t lo = 0, hi = nseq - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Whether index-table slot value s names a key in [0, tokens) (negative: an empty slot).
__device__ __forceinline__ bool valid_slot(int32_t s, int64_t tokens) {
  return s >= 0 && s < tokens;
}

}  // namespace mt::ops::cuda
