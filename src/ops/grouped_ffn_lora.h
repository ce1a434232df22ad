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
  swiglu_forward(ctx, adapted, h);
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
  swiglu_backward(ctx, adapted, dh_all, dgate_up);
}

}  // namespace mt::ops::lora_composite
