// Axial 2-D rotary embedding of the kimi_k25 / MoonViT vision tower. Each head of dimension d is
// rotated whole, in half-split pairs (j, j + d/2) for j < d/2, with d/4 frequencies
// f_i = theta^(-4i/d) (transformers' base^(-arange(0, d/2, 2) / (d/2))). Pair j turns by
// col * f_{j/2} when j is even and by row * f_{j/2} when j is odd: the row and column angles
// interleave (transformers' recomposition_frequencies, which flips (h, w) to (w, h)).
#pragma once

#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct Rope2dParams {
  int64_t tokens = 0, heads = 0, head_dim = 0;  // head_dim a multiple of 4
  float theta = 10000.f;
};

// The d/4 inverse frequencies (validates the params).
std::vector<double> rope2d_inv_freq(const Rope2dParams& p);

// x, y [tokens, heads, head_dim] (y may alias x); positions i32 [tokens, 2]: (row, col).
using Rope2dForward = void(Context& ctx, const Rope2dParams& p, const Tensor& positions,
                           const Tensor& x, Tensor& y);
Rope2dForward rope2d_forward;
// The inverse rotation; dx written (may alias dy).
using Rope2dBackward = void(Context& ctx, const Rope2dParams& p, const Tensor& positions,
                            const Tensor& dy, Tensor& dx);
Rope2dBackward rope2d_backward;

// The backends' one body, called by the entries above once they validated (ops/cpu/rope2d.cpp, and
// ops/cuda/rope2d.cu in CUDA builds): the rotation by sign times each angle, +1 for
// rope2d_forward and -1 for rope2d_backward.
using Rope2dRotate = void(Context& ctx, const Rope2dParams& p, const Tensor& positions,
                          const Tensor& x, Tensor& y, double sign);
MT_OP_BACKENDS(Rope2dRotate rope2d_rotate;)

}  // namespace mt::ops
