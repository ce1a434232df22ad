// Linear projection y = x W^T with optional LoRA: y += (alpha / r) * (x A^T) B^T.
// W [out, in] (HF layout), A [r, in], B [out, r]. Delta W = B A is never formed.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct LinearParams {
  int64_t tokens = 0, in = 0, out = 0;
  int64_t lora_rank = 0;  // 0: no adapter
  float lora_alpha = 0;   // scale = alpha / rank
  float lora_scale() const { return lora_rank ? lora_alpha / static_cast<float>(lora_rank) : 0.f; }
};

// x [tokens, in] -> y [tokens, out] (written). With LoRA, xa [tokens, r] receives x A^T and must
// be kept for backward; A, B, xa are ignored (may be undefined) when lora_rank == 0.
using LinearForward = void(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                           const Tensor& a, const Tensor& b, Tensor& y, Tensor& xa);
LinearForward linear_forward;

// dx written, or added to when accumulate_dx (an input feeding several projections); skipped
// when dx is undefined. dw, da, db accumulate (skipped when undefined, e.g. a frozen base).
// Declared as a plain function so the default stays on the entry; the backends share its type.
void linear_backward(Context& ctx, const LinearParams& p, const Tensor& x, const Tensor& w,
                     const Tensor& a, const Tensor& b, const Tensor& xa, const Tensor& dy,
                     Tensor& dx, Tensor& dw, Tensor& da, Tensor& db, bool accumulate_dx = false);
using LinearBackward = decltype(linear_backward);

// The backends' bodies, called by the entries above once they validated: ops/cpu/linear.cpp, and
// ops/cuda/linear.cu in CUDA builds.
MT_OP_BACKENDS(LinearForward linear_forward; LinearBackward linear_backward;)

}  // namespace mt::ops
