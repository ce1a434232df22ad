// Rotary position embedding on a slice [rot_offset, rot_offset + rot_dim) of each head.
// HalfSplit (NeoX): pairs (i, i + rot_dim/2). Interleaved (GPT-J / DeepSeek MLA): pairs (2i, 2i+1).
// Frequency of pair i: theta^(-2i/rot_dim). The rest of the head is copied unchanged.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

enum class RopeStyle { HalfSplit, Interleaved };

struct RopeParams {
  int64_t tokens = 0, heads = 0, head_dim = 0;
  int64_t rot_offset = 0, rot_dim = 0;  // rot_dim even, rot_offset + rot_dim <= head_dim
  float theta = 10000.f;
  RopeStyle style = RopeStyle::HalfSplit;
};

// x, y [tokens, heads, head_dim] (y may alias x); positions i32 [tokens].
void rope_forward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& x,
                  Tensor& y);
// The inverse rotation; dx written (may alias dy).
void rope_backward(Context& ctx, const RopeParams& p, const Tensor& positions, const Tensor& dy,
                   Tensor& dx);

}  // namespace mt::ops
