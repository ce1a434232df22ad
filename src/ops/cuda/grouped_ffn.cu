// The SwiGLU between the grouped projections of the routed experts (ops/grouped_ffn.cpp runs the
// projections through grouped_matmul): h = silu(g) * u over gate_up = [g | u] [rows, 2F], and its
// backward, element-wise in the activations' type with fp32 arithmetic.
//
// Both passes are bound by HBM (forward: 2F elements read and F written per row; backward: 3F read
// and 2F written), so each thread moves 16 bytes per access where F and the addresses allow (8
// bf16 or 4 f32 columns of one row: one division per pack, not per element), single elements
// otherwise.
#include <cstdint>
#include <initializer_list>

#include "ops/cuda/common.cuh"
#include "ops/cuda/lora_grouped.h"
#include "ops/grouped_ffn.h"
#include "ops/grouped_ffn_lora.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// Pack i of the [rows, F / V] grid: its row and first column.
__device__ __forceinline__ void pack_at(int64_t i, int64_t packs, int V, int64_t& r, int64_t& c) {
  r = i / packs;
  c = (i - r * packs) * V;
}

template <typename T, int V>
__global__ void swiglu_fwd_kernel(int64_t rows, int64_t F, const T* gu, T* h) {
  const int64_t packs = F / V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, c;
    pack_at(i, packs, V, r, c);
    const Pack<T, V> g = load_pack<T, V>(gu + r * 2 * F + c),
                     u = load_pack<T, V>(gu + r * 2 * F + F + c);
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gj = ld(g.v, j);
      st(out.v, j, gj / (1.0f + expf(-gj)) * ld(u.v, j));
    }
    store_pack(h + r * F + c, out);
  }
}

template <typename T, int V>
__global__ void swiglu_bwd_kernel(int64_t rows, int64_t F, const T* gu, const T* dh, T* dgu) {
  const int64_t packs = F / V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, c;
    pack_at(i, packs, V, r, c);
    const Pack<T, V> g = load_pack<T, V>(gu + r * 2 * F + c),
                     u = load_pack<T, V>(gu + r * 2 * F + F + c),
                     d = load_pack<T, V>(dh + r * F + c);
    Pack<T, V> dg, du;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gj = ld(g.v, j), uj = ld(u.v, j), dj = ld(d.v, j);
      const float sg = 1.0f / (1.0f + expf(-gj));
      st(du.v, j, dj * gj * sg);
      st(dg.v, j, dj * uj * sg * (1.0f + gj * (1.0f - sg)));
    }
    store_pack(dgu + r * 2 * F + c, dg);
    store_pack(dgu + r * 2 * F + F + c, du);
  }
}

}  // namespace

void grouped_ffn_swiglu_forward(Context& ctx, const Tensor& gate_up, Tensor& h) {
  expect_same_dtype("grouped_ffn swiglu", gate_up, h, "h");
  const int64_t rows = h.dim(0), F = h.dim(1);
  if (rows * F == 0) return;
  MT_DISPATCH_FLOAT(gate_up, "grouped_ffn swiglu", {
    constexpr int V = 16 / sizeof(T);
    if (packs_fit<T>(F, {gate_up.raw(), h.raw()}))
      swiglu_fwd_kernel<T, V><<<blocks_for(rows * F / V, kThreads), kThreads, 0, stream(ctx)>>>(
          rows, F, ptr<T>(gate_up), ptr<T>(h));
    else
      swiglu_fwd_kernel<T, 1><<<blocks_for(rows * F, kThreads), kThreads, 0, stream(ctx)>>>(
          rows, F, ptr<T>(gate_up), ptr<T>(h));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void grouped_ffn_swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                 Tensor& dgate_up) {
  expect_same_dtype("grouped_ffn swiglu", gate_up, dh, "dh");
  expect_same_dtype("grouped_ffn swiglu", gate_up, dgate_up, "dgate_up");
  const int64_t rows = dh.dim(0), F = dh.dim(1);
  if (rows * F == 0) return;
  MT_DISPATCH_FLOAT(gate_up, "grouped_ffn swiglu", {
    constexpr int V = 16 / sizeof(T);
    if (packs_fit<T>(F, {gate_up.raw(), dh.raw(), dgate_up.raw()}))
      swiglu_bwd_kernel<T, V><<<blocks_for(rows * F / V, kThreads), kThreads, 0, stream(ctx)>>>(
          rows, F, ptr<T>(gate_up), ptr<T>(dh), ptr<T>(dgate_up));
    else
      swiglu_bwd_kernel<T, 1><<<blocks_for(rows * F, kThreads), kThreads, 0, stream(ctx)>>>(
          rows, F, ptr<T>(gate_up), ptr<T>(dh), ptr<T>(dgate_up));
  });
  MT_CUDA_LAUNCH_CHECK();
}

void grouped_ffn_lora_out_grads(Context& ctx, const GroupedFfnParams& p, const Tensor& dout,
                                const Tensor& offsets, const Tensor& b, const Tensor& xa,
                                Tensor& dr, Tensor& db) {
  if (!skinny_lora_out_grads(ctx, dout, offsets, b, xa, p.lora_scale(), dr, db))
    cpu::grouped_ffn_lora_out_grads(ctx, p, dout, offsets, b, xa, dr, db);
}

void grouped_ffn_lora_swiglu(Context& ctx, const GroupedFfnParams& p, const Tensor& xa,
                             const Tensor& offsets, const Tensor& b, const Tensor& gate_up,
                             Tensor& h) {
  if (skinny_lora_swiglu(ctx, xa, offsets, b, p.lora_scale(), gate_up, h)) return;
  lora_composite::swiglu(ctx, p, xa, offsets, b, gate_up, h, grouped_ffn_swiglu_forward);
}

void grouped_ffn_lora_swiglu_backward(Context& ctx, const GroupedFfnParams& p,
                                      const Tensor& gate_up, const Tensor& xa,
                                      const Tensor& offsets, const Tensor& b, const Tensor& dh,
                                      const Tensor& dr, const Tensor& a_down, Tensor& dgate_up) {
  if (skinny_lora_swiglu_backward(ctx, gate_up, xa, offsets, b, dh, dr, a_down, p.lora_scale(),
                                  dgate_up))
    return;
  lora_composite::swiglu_backward(ctx, p, gate_up, xa, offsets, b, dh, dr, a_down, dgate_up,
                                  grouped_ffn_swiglu_backward);
}

}  // namespace mt::ops::cuda
