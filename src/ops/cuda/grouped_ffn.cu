// The SwiGLU between the grouped projections of the routed experts (ops/grouped_ffn.cpp runs the
// projections through grouped_matmul): h = silu(g) * u over gate_up = [g | u] [rows, 2F], and its
// backward, element-wise in the activations' type with fp32 arithmetic.
//
// Both passes are bound by HBM (forward: 2F elements read and F written per row; backward: 3F read
// and 2F written), so each thread moves 16 bytes per access where F and the addresses allow (8
// bf16 or 4 f32 columns of one row: one division per pack, not per element), single elements
// otherwise. One pack per thread: the forward with two (both loaded before either is stored, for
// more bytes in flight) measured slower at issue 14's shape A (session 15 ncu: 0.275 ms against
// 0.252).
#include <cstdint>
#include <initializer_list>

#include "ops/cuda/common.cuh"
#include "ops/cuda/grouped_matmul.h"
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

// Row pitches in elements: the tensors may be row-pitched views (the K-concatenation path's
// padded h and dgate_up, ops/grouped_ffn.h).
struct Pitches {
  int64_t gu, h, dgu;
};

// gate_up's columns in blocks of `block` (grouped_ffn_gate_up_block; a multiple of V): pack c's
// gate at grouped_ffn_gate_column(c, block), its up `block` further.
template <typename T, int V>
__global__ void swiglu_fwd_kernel(int64_t rows, int64_t F, int64_t block, const T* gu, T* h,
                                  Pitches pitch) {
  const int64_t packs = F / V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, c;
    pack_at(i, packs, V, r, c);
    const T* at = gu + r * pitch.gu + grouped_ffn_gate_column(c, block);
    const Pack<T, V> g = load_pack<T, V>(at), u = load_pack<T, V>(at + block);
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gj = ld(g.v, j);
      st(out.v, j, gj / (1.0f + expf(-gj)) * ld(u.v, j));
    }
    store_pack(h + r * pitch.h + c, out);
  }
}

// With kH also h = silu(g) * u into `h` (at dh's pitch), as the forward kernel rounds it.
template <typename T, int V, bool kH>
__global__ void swiglu_bwd_kernel(int64_t rows, int64_t F, int64_t block, const T* gu, const T* dh,
                                  T* dgu, T* h, Pitches pitch) {
  const int64_t packs = F / V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, c;
    pack_at(i, packs, V, r, c);
    const int64_t gc = grouped_ffn_gate_column(c, block);
    const Pack<T, V> g = load_pack<T, V>(gu + r * pitch.gu + gc),
                     u = load_pack<T, V>(gu + r * pitch.gu + gc + block),
                     d = load_pack<T, V>(dh + r * pitch.h + c);
    Pack<T, V> dg, du, hv;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gj = ld(g.v, j), uj = ld(u.v, j), dj = ld(d.v, j);
      const float sg = 1.0f / (1.0f + expf(-gj));
      st(du.v, j, dj * gj * sg);
      st(dg.v, j, dj * uj * sg * (1.0f + gj * (1.0f - sg)));
      // The forward kernel's expression, so h is the same bits as forward's.
      if constexpr (kH) st(hv.v, j, gj / (1.0f + expf(-gj)) * uj);
    }
    store_pack(dgu + r * pitch.dgu + gc, dg);
    store_pack(dgu + r * pitch.dgu + gc + block, du);
    if constexpr (kH) store_pack(h + r * pitch.h + c, hv);
  }
}

// Whether rows of width F move in 16-byte packs: the bases aligned and every pitch a whole number
// of packs.
template <typename T>
bool pitched_packs_fit(int64_t F, std::initializer_list<const void*> bases,
                       std::initializer_list<int64_t> pitches) {
  bool ok = packs_fit<T>(F, bases);
  for (int64_t w : pitches) ok = ok && w % (16 / static_cast<int64_t>(sizeof(T))) == 0;
  return ok;
}

void expect_rows(const Tensor& t, const char* what) {
  MT_CHECK(t.ndim() == 2 && t.stride(1) == 1, ShapeError, "grouped_ffn swiglu ", what, " ",
           t.shape(), ": rows must be dense (strides ", t.strides(), ")");
}

void expect_block(int64_t F, int64_t block) {
  MT_CHECK(block > 0 && F % block == 0, ShapeError, "grouped_ffn swiglu: gate/up blocks of ", block,
           " columns do not tile F ", F);
}

}  // namespace

void grouped_ffn_swiglu_forward(Context& ctx, const Tensor& gate_up, Tensor& h, int64_t block) {
  expect_same_dtype("grouped_ffn swiglu", gate_up, h, "h");
  expect_rows(gate_up, "gate_up");
  expect_rows(h, "h");
  const int64_t rows = h.dim(0), F = h.dim(1);
  expect_block(F, block);
  if (rows * F == 0) return;
  const Pitches pitches{gate_up.stride(0), h.stride(0), 0};
  MT_DISPATCH_FLOAT(gate_up, "grouped_ffn swiglu", {
    constexpr int V = 16 / sizeof(T);
    const auto* gu = static_cast<const T*>(gate_up.raw());
    auto* ph = static_cast<T*>(h.raw());
    if (block % V == 0 &&
        pitched_packs_fit<T>(F, {gate_up.raw(), h.raw()}, {pitches.gu, pitches.h}))
      swiglu_fwd_kernel<T, V><<<blocks_for(rows * F / V, kThreads), kThreads, 0, stream(ctx)>>>(
          rows, F, block, gu, ph, pitches);
    else
      swiglu_fwd_kernel<T, 1><<<blocks_for(rows * F, kThreads), kThreads, 0, stream(ctx)>>>(
          rows, F, block, gu, ph, pitches);
  });
  MT_CUDA_LAUNCH_CHECK();
}

namespace {

// dgate_up, and h when `h` is defined (at dh's row pitch).
void swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& dh, Tensor& dgate_up,
                     const Tensor* h, int64_t block) {
  expect_same_dtype("grouped_ffn swiglu", gate_up, dh, "dh");
  expect_same_dtype("grouped_ffn swiglu", gate_up, dgate_up, "dgate_up");
  expect_rows(gate_up, "gate_up");
  expect_rows(dh, "dh");
  expect_rows(dgate_up, "dgate_up");
  const int64_t rows = dh.dim(0), F = dh.dim(1);
  if (h) {
    expect_same_dtype("grouped_ffn swiglu", gate_up, *h, "h");
    expect_rows(*h, "h");
    MT_CHECK(h->dim(0) == rows && h->dim(1) == F && h->stride(0) == dh.stride(0), ShapeError,
             "grouped_ffn swiglu h ", h->shape(), " (strides ", h->strides(), "): dh's shape ",
             dh.shape(), " and row pitch ", dh.stride(0), " expected");
  }
  expect_block(F, block);
  if (rows * F == 0) return;
  const Pitches pitches{gate_up.stride(0), dh.stride(0), dgate_up.stride(0)};
  MT_DISPATCH_FLOAT(gate_up, "grouped_ffn swiglu", {
    constexpr int V = 16 / sizeof(T);
    const auto* gu = static_cast<const T*>(gate_up.raw());
    const auto* d = static_cast<const T*>(dh.raw());
    auto* dg = static_cast<T*>(dgate_up.raw());
    auto* ph = h ? static_cast<T*>(h->raw()) : nullptr;
    const bool packs = block % V == 0 &&
                       pitched_packs_fit<T>(F, {gate_up.raw(), dh.raw(), dgate_up.raw()},
                                            {pitches.gu, pitches.h, pitches.dgu}) &&
                       (!h || pitched_packs_fit<T>(F, {h->raw()}, {pitches.h}));
    const auto launch = [&](auto kernel, int v) {
      kernel<<<blocks_for(rows * F / v, kThreads), kThreads, 0, stream(ctx)>>>(rows, F, block, gu,
                                                                               d, dg, ph, pitches);
    };
    if (packs && h)
      launch(swiglu_bwd_kernel<T, V, true>, V);
    else if (packs)
      launch(swiglu_bwd_kernel<T, V, false>, V);
    else if (h)
      launch(swiglu_bwd_kernel<T, 1, true>, 1);
    else
      launch(swiglu_bwd_kernel<T, 1, false>, 1);
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void grouped_ffn_swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                 Tensor& dgate_up, int64_t block) {
  swiglu_backward(ctx, gate_up, dh, dgate_up, nullptr, block);
}

void grouped_ffn_swiglu_backward_with_h(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                        Tensor& dgate_up, Tensor& h, int64_t block) {
  swiglu_backward(ctx, gate_up, dh, dgate_up, &h, block);
}

namespace {

const GroupedGemmConfig& gemm_config(const GroupedFfnParams& p) {
  return p.gemm ? *p.gemm : grouped_gemm_config_from_env();
}

}  // namespace

bool grouped_ffn_gate_up_swiglu(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                                const Tensor& offsets, const Tensor& w_gu, Tensor& gate_up,
                                Tensor& h) {
  const GroupedGemmConfig& cfg = gemm_config(p);
  if (p.interleaved_gate_up)
    return grouped_gate_up_swiglu_interleaved(ctx, cfg, x, offsets, w_gu, gate_up, h);
  return cfg.swiglu_fwd && grouped_gate_up_swiglu(ctx, cfg, x, offsets, w_gu, gate_up, h);
}

bool grouped_ffn_down_swiglu_backward(Context& ctx, const GroupedFfnParams& p, const Tensor& dy,
                                      const Tensor& offsets, const Tensor& w_down,
                                      const Tensor& gate_up, Tensor& dgate_up, Tensor& h) {
  const GroupedGemmConfig& cfg = gemm_config(p);
  // Its epilogue reads gate_up as [g | u].
  return cfg.swiglu_bwd && !p.interleaved_gate_up &&
         grouped_down_swiglu_backward(ctx, cfg, dy, offsets, w_down, gate_up, dgate_up, h);
}

void grouped_ffn_lora_out_grads(Context& ctx, const GroupedFfnParams& p, const Tensor& dout,
                                const Tensor& offsets, const Tensor& b, const Tensor& xa,
                                Tensor& dr, Tensor& db) {
  // Separate: the two grouped products (the CPU body's calls, on the skinny kernels).
  if (p.lora_s13_kernels || p.lora_out_grads != LoraKernels::Separate)
    if (skinny_lora_out_grads(ctx, dout, offsets, b, xa, p.lora_scale(), dr, db, p.lora_s13_kernels,
                              p.lora_out_grads == LoraKernels::Registers))
      return;
  cpu::grouped_ffn_lora_out_grads(ctx, p, dout, offsets, b, xa, dr, db);
}

void grouped_ffn_lora_swiglu(Context& ctx, const GroupedFfnParams& p, const Tensor& xa,
                             const Tensor& offsets, const Tensor& b, const Tensor& gate_up,
                             Tensor& h) {
  // The skinny SwiGLU kernels read gate_up as [g | u]: the interleaved layout takes the composite.
  if (!p.interleaved_gate_up && skinny_lora_swiglu(ctx, xa, offsets, b, p.lora_scale(), gate_up, h))
    return;
  lora_composite::swiglu(ctx, p, xa, offsets, b, gate_up, h, grouped_ffn_swiglu_forward);
}

void grouped_ffn_lora_swiglu_backward(Context& ctx, const GroupedFfnParams& p,
                                      const Tensor& gate_up, const Tensor& xa,
                                      const Tensor& offsets, const Tensor& b, const Tensor& dh,
                                      const Tensor& dr, const Tensor& a_down, Tensor& dgate_up) {
  if (!p.interleaved_gate_up && skinny_lora_swiglu_backward(ctx, gate_up, xa, offsets, b, dh, dr,
                                                            a_down, p.lora_scale(), dgate_up))
    return;
  lora_composite::swiglu_backward(ctx, p, gate_up, xa, offsets, b, dh, dr, a_down, dgate_up,
                                  grouped_ffn_swiglu_backward);
}

void grouped_ffn_lora_pack(Context& ctx, const GroupedFfnParams& p, const GroupedFfnWeights& w) {
  if (skinny_lora_pack(ctx, p.lora_scale(), w.gate_up_a, w.gate_up_b, w.gate_up, w.down_a, w.down_b,
                       w.down))
    return;
  lora_composite::pack(ctx, p, w);
}

void grouped_ffn_lora_swiglu_backward_grads(Context& ctx, const GroupedFfnParams& p,
                                            const Tensor& gate_up, const Tensor& dh,
                                            const Tensor& offsets, const Tensor& h,
                                            const Tensor& dr_down, const Tensor& xa,
                                            const Tensor& b_gu, Tensor& dgate_up, Tensor& dr_gu,
                                            Tensor& db_gu, Tensor& da_down) {
  if (!p.interleaved_gate_up &&
      skinny_lora_swiglu_bwd_grads(ctx, gate_up, dh, offsets, dr_down, xa, b_gu, p.lora_scale(),
                                   dgate_up, dr_gu, db_gu, da_down,
                                   p.lora_bwd == LoraKernels::Registers))
    return;
  lora_composite::swiglu_backward_grads(ctx, p, gate_up, dh, offsets, h, dr_down, xa, b_gu,
                                        dgate_up, dr_gu, db_gu, da_down,
                                        grouped_ffn_swiglu_backward, grouped_ffn_lora_out_grads);
}

void grouped_ffn_lora_swiglu_ha(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
                                const Tensor& offsets, const Tensor& a_down, Tensor& h,
                                Tensor& ha) {
  if (!p.interleaved_gate_up && skinny_lora_swiglu_ha(ctx, gate_up, offsets, a_down, h, ha,
                                                      p.lora_fwd == LoraKernels::Registers))
    return;
  lora_composite::swiglu_ha(ctx, p, gate_up, offsets, a_down, h, ha, grouped_ffn_swiglu_forward);
}

bool grouped_ffn_lora_gate_up(Context& ctx, const GroupedFfnParams& p, const Tensor& xp,
                              const Tensor& offsets, const Tensor& a_gu, const Tensor& w_gu,
                              Tensor& gate_up, Tensor& h) {
  // The interleaved layout: the GEMM's epilogue writes h too.
  Tensor* with_h = p.interleaved_gate_up && h.defined() ? &h : nullptr;
  if (p.lora_xa == LoraKernels::Gemm && !p.lora_s13_kernels &&
      grouped_gate_up_lora_xa(ctx, xp, offsets, w_gu, p.lora_rank, gate_up, with_h))
    return with_h != nullptr;
  lora_composite::gate_up(ctx, p, xp, offsets, a_gu, w_gu, gate_up, grouped_ffn_lora_xa);
  return false;
}

void grouped_ffn_lora_dx(Context& ctx, const GroupedFfnParams& p, const Tensor& dyp,
                         const Tensor& offsets, const Tensor& b, const Tensor& r_rows,
                         const Tensor& w_dx, Tensor& db, Tensor& dx) {
  // dB's partials meet through atomics: a deterministic context keeps the separate passes.
  if (p.lora_dr == LoraKernels::Gemm && !p.lora_s13_kernels && !ctx.deterministic() &&
      db.defined() && db.numel() > 0 &&
      grouped_dx_lora_dr(ctx, dyp, offsets, w_dx, p.lora_rank, r_rows, p.lora_scale(), db, dx))
    return;
  lora_composite::dx(ctx, p, dyp, offsets, b, r_rows, w_dx, db, dx, grouped_ffn_lora_out_grads);
}

void grouped_ffn_lora_xa(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                         const Tensor& offsets, const Tensor& a, Tensor& xa) {
  // lora_s13_kernels: session 13's passes throughout, so that bench moe's lora_s13_* stay theirs.
  if (p.lora_xa == LoraKernels::Registers && !p.lora_s13_kernels &&
      skinny_lora_xa(ctx, x, offsets, a, xa))
    return;
  cpu::grouped_ffn_lora_xa(ctx, p, x, offsets, a, xa);  // grouped_matmul: the skinny down kernel
}

}  // namespace mt::ops::cuda
