// Token dispatch on the GPU (direct version). The plan is a stable sort of the flat slots by expert
// id: CUB's radix sort is stable, so equal ids keep slot order, as the CPU's counting sort does;
// the offsets are lower bounds in the sorted ids. Gather and combine work per row or per token and
// read through perm / inv, so every output element has one writer and no atomics are needed.
#include <cub/cub.cuh>

#include "ops/cuda/common.cuh"
#include "ops/moe_dispatch.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void iota_kernel(int64_t n, int32_t* v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    v[i] = static_cast<int32_t>(i);
}

// inv[perm[p]] = p; offsets[e] = the first sorted row whose id is >= e (e in [0, E]).
__global__ void plan_finish_kernel(int64_t n, int64_t E, const uint32_t* sorted,
                                   const int32_t* perm, int32_t* inv, int32_t* offsets) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (int64_t p = first; p < n; p += stride) inv[perm[p]] = static_cast<int32_t>(p);
  for (int64_t e = first; e <= E; e += stride) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<int64_t>(sorted[mid]) < e)
        lo = mid + 1;
      else
        hi = mid;
    }
    offsets[e] = static_cast<int32_t>(lo);
  }
}

// The row kernels below move V elements per access (16-byte packs where the width and the
// addresses allow, single elements otherwise: with_pack): one element at a time they ran
// at 1-2 TB/s (bench moe, session 10). Sums keep the k slots' order per element.
template <typename T, int V>
__global__ void gather_kernel(int64_t n, int64_t w, int64_t k, const T* x, const int32_t* perm,
                              T* rows, int64_t ldr) {
  const int64_t r = blockIdx.x;
  if (r >= n) return;
  const T* src = x + static_cast<int64_t>(perm[r] / k) * w;
  for (int64_t c = threadIdx.x * V; c < w; c += blockDim.x * V)
    store_pack(rows + r * ldr + c, load_pack<T, V>(src + c));
}

template <typename T, int V>
__global__ void gather_bwd_kernel(int64_t w, int64_t k, const T* drows, const int32_t* inv, T* dx,
                                  bool accumulate) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x * V; c < w; c += blockDim.x * V) {
    float s[V];
    Pack<T, V> out;
    if (accumulate) out = load_pack<T, V>(dx + t * w + c);
#pragma unroll
    for (int e = 0; e < V; ++e) s[e] = accumulate ? ld(out.v, e) : 0.f;
    for (int64_t j = 0; j < k; ++j) {
      const Pack<T, V> d = load_pack<T, V>(drows + static_cast<int64_t>(inv[t * k + j]) * w + c);
#pragma unroll
      for (int e = 0; e < V; ++e) s[e] += ld(d.v, e);
    }
#pragma unroll
    for (int e = 0; e < V; ++e) st(out.v, e, s[e]);
    store_pack(dx + t * w + c, out);
  }
}

template <typename T, int V>
__global__ void combine_kernel(int64_t w, int64_t k, const T* rows, const float* weights,
                               const int32_t* inv, T* y) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x * V; c < w; c += blockDim.x * V) {
    float s[V] = {};
    for (int64_t j = 0; j < k; ++j) {
      const float a = weights[t * k + j];
      const Pack<T, V> x = load_pack<T, V>(rows + static_cast<int64_t>(inv[t * k + j]) * w + c);
#pragma unroll
      for (int e = 0; e < V; ++e) s[e] += a * ld(x.v, e);
    }
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) st(out.v, e, s[e]);
    store_pack(y + t * w + c, out);
  }
}

template <typename T, int V>
__global__ void combine_bwd_kernel(int64_t w, int64_t k, const T* rows, const float* weights,
                                   const int32_t* inv, const T* dy, T* drows, int64_t lddr,
                                   float* dweights) {
  const int64_t t = blockIdx.x;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = inv[t * k + j];
    const float a = weights[t * k + j];
    float dot = 0.f;
    for (int64_t c = threadIdx.x * V; c < w; c += blockDim.x * V) {
      const Pack<T, V> g = load_pack<T, V>(dy + t * w + c), x = load_pack<T, V>(rows + r * w + c);
      Pack<T, V> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        dot += ld(g.v, e) * ld(x.v, e);
        st(out.v, e, a * ld(g.v, e));
      }
      store_pack(drows + r * lddr + c, out);
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dweights[t * k + j] = dot;
  }
}

unsigned grid_of(int64_t n) {
  return static_cast<unsigned>(n < 1 ? 1 : n);
}

}  // namespace

void moe_dispatch_plan(Context& ctx, const Tensor& ids, int64_t experts, Tensor& perm, Tensor& inv,
                       Tensor& offsets) {
  const int64_t n = ids.numel();
  cudaStream_t s = stream(ctx);
  if (n == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(offsets.raw(), 0, offsets.bytes(), s));
    return;
  }
  MT_CHECK(n < INT32_MAX, ValueError, "moe_dispatch_plan: ", n, " slots exceed the i32 plan");
  // Only the bits an id in [0, E) can set take part in the sort (ids are the router's, in range).
  int end_bit = 1;
  while ((int64_t{1} << end_bit) < experts) ++end_bit;
  ArenaScope scope(ctx.workspace());
  Tensor keys = ctx.workspace().alloc({n}, DType::I32);
  Tensor slots = ctx.workspace().alloc({n}, DType::I32);
  const auto* keys_in = static_cast<const uint32_t*>(ids.raw());
  auto* keys_out = ptr<uint32_t>(keys);
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out,
                                                ptr<int32_t>(slots), ptr<int32_t>(perm),
                                                static_cast<int>(n), 0, end_bit, s));
  Tensor temp =
      ctx.workspace().alloc({static_cast<int64_t>((temp_bytes + 256 + 7) / 8)}, DType::I64);
  iota_kernel<<<blocks_for(n, kThreads, 4096), kThreads, 0, s>>>(n, ptr<int32_t>(slots));
  MT_CUDA_LAUNCH_CHECK();
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), temp_bytes, keys_in, keys_out,
                                                ptr<int32_t>(slots), ptr<int32_t>(perm),
                                                static_cast<int>(n), 0, end_bit, s));
  plan_finish_kernel<<<blocks_for(n > experts ? n : experts + 1, kThreads, 4096), kThreads, 0, s>>>(
      n, experts, keys_out, ptr<int32_t>(perm), ptr<int32_t>(inv), ptr<int32_t>(offsets));
  MT_CUDA_LAUNCH_CHECK();
}

void moe_gather(Context& ctx, const Tensor& x, const Tensor& perm, int64_t top_k, Tensor& rows) {
  expect_same_dtype("moe_gather", x, rows, "rows");
  MT_CHECK(x.is_contiguous() && rows.stride(1) == 1, ShapeError, "moe_gather: x ", x.strides(),
           ", rows ", rows.strides(), ": dense rows expected");
  const int64_t n = rows.dim(0), w = rows.dim(1), ldr = rows.stride(0);
  if (n == 0 || w == 0) return;
  // rows may be row-pitched: the first columns of the experts' padded input (ops/grouped_ffn.h).
  MT_DISPATCH_FLOAT(x, "moe_gather", {
    with_pack<T>(
        packs_fit<T>(w, {x.raw(), rows.raw()}) && ldr % static_cast<int64_t>(16 / sizeof(T)) == 0,
        [&](auto v) {
          gather_kernel<T, v()><<<grid_of(n), kThreads, 0, stream(ctx)>>>(
              n, w, top_k, ptr<T>(x), ptr<int32_t>(perm), ptr<T>(rows), ldr);
        });
  });
  MT_CUDA_LAUNCH_CHECK();
}

void moe_gather_backward(Context& ctx, const Tensor& drows, const Tensor& inv, int64_t top_k,
                         Tensor& dx, bool accumulate) {
  expect_same_dtype("moe_gather_backward", drows, dx, "dx");
  const int64_t tokens = dx.dim(0), w = dx.dim(1);
  if (tokens == 0 || w == 0) return;
  MT_DISPATCH_FLOAT(drows, "moe_gather_backward", {
    with_pack<T>(packs_fit<T>(w, {drows.raw(), dx.raw()}), [&](auto v) {
      gather_bwd_kernel<T, v()><<<grid_of(tokens), kThreads, 0, stream(ctx)>>>(
          w, top_k, ptr<T>(drows), ptr<int32_t>(inv), ptr<T>(dx), accumulate);
    });
  });
  MT_CUDA_LAUNCH_CHECK();
}

void moe_combine(Context& ctx, const Tensor& rows, const Tensor& weights, const Tensor& inv,
                 Tensor& y) {
  expect_same_dtype("moe_combine", rows, y, "y");
  expect_f32("moe_combine", weights, "gate weights");
  const int64_t tokens = y.dim(0), w = y.dim(1), K = weights.dim(1);
  if (tokens == 0 || w == 0) return;
  MT_DISPATCH_FLOAT(rows, "moe_combine", {
    with_pack<T>(packs_fit<T>(w, {rows.raw(), y.raw()}), [&](auto v) {
      combine_kernel<T, v()><<<grid_of(tokens), kThreads, 0, stream(ctx)>>>(
          w, K, ptr<T>(rows), ptr<float>(weights), ptr<int32_t>(inv), ptr<T>(y));
    });
  });
  MT_CUDA_LAUNCH_CHECK();
}

void moe_combine_backward(Context& ctx, const Tensor& rows, const Tensor& weights,
                          const Tensor& inv, const Tensor& dy, Tensor& drows, Tensor& dweights) {
  expect_same_dtype("moe_combine_backward", rows, dy, "dy");
  expect_same_dtype("moe_combine_backward", rows, drows, "drows");
  expect_f32("moe_combine_backward", weights, "gate weights");
  expect_f32("moe_combine_backward", dweights, "gate weight gradient");
  const int64_t tokens = dy.dim(0), w = dy.dim(1), K = weights.dim(1);
  if (tokens == 0) return;
  if (w == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(dweights.raw(), 0, dweights.bytes(), stream(ctx)));
    return;
  }
  MT_CHECK(rows.is_contiguous() && dy.is_contiguous() && drows.stride(1) == 1, ShapeError,
           "moe_combine_backward: drows ", drows.strides(), ": dense rows expected");
  // drows may be row-pitched: the first columns of the experts' padded dY (ops/grouped_ffn.h).
  const int64_t lddr = drows.stride(0);
  MT_DISPATCH_FLOAT(rows, "moe_combine_backward", {
    with_pack<T>(packs_fit<T>(w, {rows.raw(), dy.raw(), drows.raw()}) &&
                     lddr % static_cast<int64_t>(16 / sizeof(T)) == 0,
                 [&](auto v) {
                   combine_bwd_kernel<T, v()><<<grid_of(tokens), kThreads, 0, stream(ctx)>>>(
                       w, K, ptr<T>(rows), ptr<float>(weights), ptr<int32_t>(inv), ptr<T>(dy),
                       ptr<T>(drows), lddr, ptr<float>(dweights));
                 });
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
