// The CPU path of ops/grouped_ffn.h: the SwiGLU between the two grouped projections, on the fused
// [rows, 2F] gate_up pre-activation (gate = columns 0..F-1, up = F..2F-1). Called by the entries
// after they validated, so it does not re-check.
#pragma once

#include "ops/grouped_ffn.h"

namespace mt::ops::cpu {

// h = silu(gate) * up, written.
void grouped_ffn_swiglu_forward(Context& ctx, const Tensor& gate_up, Tensor& h);
// dgate_up from dh, written.
void grouped_ffn_swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                 Tensor& dgate_up);

}  // namespace mt::ops::cpu
