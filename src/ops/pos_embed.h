// Learned position embeddings resampled to each image's patch grid (transformers' kimi_k25 /
// MoonViT tower): a [table_rows, table_cols, dim] table is interpolated to the image's
// [rows, cols] grid as F.interpolate(mode, align_corners=False) would (half-pixel centres, taps
// outside the table clamped to its border; bicubic is Keys' kernel with a = -0.75), and the
// result is added to the patch embeddings. The interpolation is separable and linear in the
// table, so each patch reads a fixed weighted set of table rows (4 taps bilinear, 16 bicubic):
// pos_embed_taps computes them once per batch on the host, and the ops are a weighted gather
// (forward) and its scatter (backward).
#pragma once

#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"
#include "ops/vision_grid.h"

namespace mt::ops {

enum class PosInterp { Bilinear, Bicubic };

struct PosEmbedParams {
  int64_t patches = 0, table_rows = 0, table_cols = 0, dim = 0;
  PosInterp mode = PosInterp::Bicubic;
  int64_t taps() const { return mode == PosInterp::Bicubic ? 16 : 4; }
};

// idx i32 [patches, taps] (flat table row r * table_cols + c) and wts f32 [patches, taps] for the
// images of `grids` packed in order (p.patches must be their total). Host tensors.
void pos_embed_taps(const PosEmbedParams& p, const std::vector<ImageGrid>& grids, Tensor& idx,
                    Tensor& wts);

// y[n] = x[n] + sum_k wts[n, k] * table[idx[n, k]]; x, y [patches, dim] (y may be x); table
// [table_rows, table_cols, dim].
using PosEmbedForward = void(Context& ctx, const PosEmbedParams& p, const Tensor& idx,
                             const Tensor& wts, const Tensor& table, const Tensor& x, Tensor& y);
PosEmbedForward pos_embed_forward;
// dtable[idx[n, k]] += wts[n, k] * dy[n] (a parameter: accumulates). The gradient of x is dy.
using PosEmbedBackward = void(Context& ctx, const PosEmbedParams& p, const Tensor& idx,
                              const Tensor& wts, const Tensor& dy, Tensor& dtable);
PosEmbedBackward pos_embed_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/pos_embed.cpp, and
// ops/cuda/pos_embed.cu in CUDA builds.
MT_OP_BACKENDS(PosEmbedForward pos_embed_forward; PosEmbedBackward pos_embed_backward;)

}  // namespace mt::ops
