// Rotary position embedding on a slice [rot_offset, rot_offset + rot_dim) of each head.
// HalfSplit (NeoX): pairs (i, i + rot_dim/2). Interleaved (GPT-J / DeepSeek MLA): pairs (2i, 2i+1).
// Frequency of pair i: theta^(-2i/rot_dim), or its YaRN correction (RopeScaling). The rest of
// the head is copied unchanged.
#pragma once

#include <span>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

enum class RopeStyle { HalfSplit, Interleaved };

// YaRN ("NTK-by-parts", arXiv:2309.00071) as transformers' rope utilities compute it: pairs that
// turn fewer than beta_slow times over the pretraining context are interpolated (frequency /
// factor), pairs turning more than beta_fast times keep their frequency, with a linear ramp over
// the (truncated) correction range in between. factor <= 1 is plain RoPE.
struct RopeScaling {
  float factor = 1.f;
  float beta_fast = 32.f, beta_slow = 1.f;
  int64_t original_max_positions = 4096;
  bool truncate = true;
  float magnitude = 1.f;  // cos and sin are multiplied by this (YaRN's "attention factor")
};

struct RopeParams {
  int64_t tokens = 0, heads = 0, head_dim = 0;
  int64_t rot_offset = 0, rot_dim = 0;  // rot_dim even, rot_offset + rot_dim <= head_dim
  float theta = 10000.f;
  RopeStyle style = RopeStyle::HalfSplit;
  RopeScaling scaling{};
};

// The rot_dim / 2 inverse frequencies the rotation uses (validates theta and the scaling).
std::vector<double> rope_inv_freq(const RopeParams& p);
// The same into inv (rot_dim / 2 entries), without allocating: the form kernels call in a step.
void rope_inv_freq(const RopeParams& p, std::span<double> inv);

// x, y [tokens, heads, head_dim] (y may alias x); positions i32 [tokens].
using RopeForward = void(Context& ctx, const RopeParams& p, const Tensor& positions,
                         const Tensor& x, Tensor& y);
RopeForward rope_forward;
// The inverse rotation; dx written (may alias dy).
using RopeBackward = void(Context& ctx, const RopeParams& p, const Tensor& positions,
                          const Tensor& dy, Tensor& dx);
RopeBackward rope_backward;

// The backends' one body, called by the entries above once they validated (ops/cpu/rope.cpp, and
// ops/cuda/rope.cu in CUDA builds): the rotation by sign times each angle, +1 for rope_forward and
// -1 for rope_backward (a rotation's inverse is its transpose).
using RopeRotate = void(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x,
                        Tensor& y, double sign);
MT_OP_BACKENDS(RopeRotate rope_rotate;)

}  // namespace mt::ops
