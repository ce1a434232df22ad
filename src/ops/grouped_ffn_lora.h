// The expert adapter's composite forms of grouped_ffn_lora_swiglu and its backward
// (ops/grouped_ffn.h): the CPU's bodies, and the GPU's where its fused kernels decline. The
// entries have chosen the device already; `swiglu` is that backend's SwiGLU body, while the copy
// and grouped_matmul calls dispatch on the tensors themselves.
#pragma once

#include "ops/elementwise.h"
#include "ops/grouped_ffn.h"
#include "ops/grouped_matmul.h"

namespace mt::ops::lora_composite {

// adapted = gate_up + s xa B^T, in the activations' type (rounded there as the fused kernels
// round it).
inline void adapted_gate_up(Context& ctx, const GroupedFfnParams& p, const Tensor& xa,
                            const Tensor& offsets, const Tensor& b, const Tensor& gate_up,
                            Tensor& adapted) {
  ops::copy(ctx, gate_up, adapted);
  ops::grouped_matmul(
      ctx, {.form = GroupedForm::XWt, .alpha = p.lora_scale(), .beta = 1.f, .gemm = p.gemm}, xa,
      offsets, b, adapted);
}

template <typename SwigluForward>
void swiglu(Context& ctx, const GroupedFfnParams& p, const Tensor& xa, const Tensor& offsets,
            const Tensor& b, const Tensor& gate_up, Tensor& h, SwigluForward swiglu_forward) {
  ArenaScope scope(ctx.workspace());
  Tensor adapted = ctx.workspace().alloc(gate_up.shape(), gate_up.dtype());
  adapted_gate_up(ctx, p, xa, offsets, b, gate_up, adapted);
  swiglu_forward(ctx, adapted, h, grouped_ffn_gate_up_block(p));
}

template <typename SwigluBackward>
void swiglu_backward(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
                     const Tensor& xa, const Tensor& offsets, const Tensor& b, const Tensor& dh,
                     const Tensor& dr, const Tensor& a_down, Tensor& dgate_up,
                     SwigluBackward swiglu_backward) {
  ArenaScope scope(ctx.workspace());
  Tensor adapted = ctx.workspace().alloc(gate_up.shape(), gate_up.dtype());
  adapted_gate_up(ctx, p, xa, offsets, b, gate_up, adapted);
  Tensor dh_all = ctx.workspace().alloc(dh.shape(), dh.dtype());
  ops::copy(ctx, dh, dh_all);
  ops::grouped_matmul(ctx, {.form = GroupedForm::DyW, .beta = 1.f, .gemm = p.gemm}, dr, offsets,
                      a_down, dh_all);
  swiglu_backward(ctx, adapted, dh_all, dgate_up, grouped_ffn_gate_up_block(p));
}

// grouped_ffn_lora_swiglu_ha as SwiGLU's forward, then ha = h A_down^T.
template <typename SwigluForward>
void swiglu_ha(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
               const Tensor& offsets, const Tensor& a_down, Tensor& h, Tensor& ha,
               SwigluForward swiglu_forward) {
  swiglu_forward(ctx, gate_up, h, grouped_ffn_gate_up_block(p));
  ops::grouped_matmul(ctx, {.form = GroupedForm::XWt, .gemm = p.gemm}, h, offsets, a_down, ha);
}

// grouped_ffn_lora_swiglu_backward_grads as SwiGLU's backward, the adapter's products over
// dgate_up (`out_grads`: the backend's grouped_ffn_lora_out_grads) and dA_down's over h.
template <typename SwigluBackward, typename OutGrads>
void swiglu_backward_grads(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
                           const Tensor& dh, const Tensor& offsets, const Tensor& h,
                           const Tensor& dr_down, const Tensor& xa, const Tensor& b_gu,
                           Tensor& dgate_up, Tensor& dr_gu, Tensor& db_gu, Tensor& da_down,
                           SwigluBackward swiglu_backward, OutGrads out_grads) {
  swiglu_backward(ctx, gate_up, dh, dgate_up, grouped_ffn_gate_up_block(p));
  out_grads(ctx, p, dgate_up, offsets, b_gu, xa, dr_gu, db_gu);
  if (da_down.defined() && da_down.numel() > 0)
    ops::grouped_matmul(ctx, {.form = GroupedForm::DytX, .beta = 1.f, .gemm = p.gemm}, dr_down,
                        offsets, h, da_down);
}

// The padded [E, out + r, in + r] buffer around the W block w [E, out, in] (grouped_ffn_padded),
// rows grouped_ffn_row_pitch(in, r) apart: a non-owning view for the call (w keeps the buffer
// alive).
inline Tensor padded_weight(const Tensor& w, int64_t r) {
  const int64_t in = w.dim(2);
  return Tensor(w.raw(), {w.dim(0), w.dim(1) + r, grouped_ffn_row_pitch(in, r)}, w.dtype(),
                w.device())
      .narrow(2, 0, in + r);
}

// grouped_ffn_lora_gate_up as xa = X A^T into xp's padding (`lora_xa`: the backend's
// grouped_ffn_lora_xa), then the grouped GEMM over [X | xa].
template <typename LoraXa>
void gate_up(Context& ctx, const GroupedFfnParams& p, const Tensor& xp, const Tensor& offsets,
             const Tensor& a_gu, const Tensor& w_gu, Tensor& gate_up, LoraXa lora_xa) {
  const int64_t l = p.in, r = p.lora_rank;
  Tensor xa = xp.cols(l, l + r);
  lora_xa(ctx, p, xp.cols(0, l), offsets, a_gu, xa);
  ops::grouped_matmul(ctx, {.form = GroupedForm::XWt, .gemm = p.gemm}, xp, offsets, w_gu, gate_up);
}

// grouped_ffn_lora_dx as the pass over dOut for dr and dB (`out_grads`: the backend's
// grouped_ffn_lora_out_grads), then the grouped GEMM over [dOut | dr].
template <typename OutGrads>
void dx(Context& ctx, const GroupedFfnParams& p, const Tensor& dyp, const Tensor& offsets,
        const Tensor& b, const Tensor& r_rows, const Tensor& w_dx, Tensor& db, Tensor& dx,
        OutGrads out_grads) {
  const int64_t r = p.lora_rank, w = dyp.dim(1) - r;
  Tensor dr = dyp.cols(w, w + r);
  out_grads(ctx, p, dyp.cols(0, w), offsets, b, r_rows, dr, db);
  ops::grouped_matmul(ctx, {.form = GroupedForm::DyW, .gemm = p.gemm}, dyp, offsets, w_dx, dx);
}

// One projection's packing (grouped_ffn_lora_pack) as a copy of A, a scale of B into scratch and
// a copy of s B: the CPU's body, and the GPU's where its kernel declines or session 13's kernels
// are asked for (GroupedFfnParams::lora_s13_kernels).
inline void pack_adapter(Context& ctx, float s, const Tensor& a, const Tensor& b, const Tensor& w) {
  const int64_t r = a.dim(1), out = w.dim(1), in = w.dim(2);
  const Tensor buf = padded_weight(w, r);
  Tensor a_at = buf.narrow(1, out, out + r).narrow(2, 0, in);
  ops::copy(ctx, a, a_at);
  ArenaScope scope(ctx.workspace());
  Tensor sb = ctx.workspace().alloc(b.shape(), b.dtype());
  ops::scale(ctx, b, s, sb);
  Tensor b_at = buf.narrow(1, 0, out).narrow(2, in, in + r);
  ops::copy(ctx, sb, b_at);
}

inline void pack(Context& ctx, const GroupedFfnParams& p, const GroupedFfnWeights& w) {
  pack_adapter(ctx, p.lora_scale(), w.gate_up_a, w.gate_up_b, w.gate_up);
  pack_adapter(ctx, p.lora_scale(), w.down_a, w.down_b, w.down);
}

}  // namespace mt::ops::lora_composite
