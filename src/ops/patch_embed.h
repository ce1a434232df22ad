// Patch embedding: transformers' Conv2d(channels, hidden, kernel = stride = patch) over one
// patch is a dot product of the patch's pixels with each filter, so over the packed patches it
// is one GEMM, y = X W^T + b, with X [patches, channels * patch * patch] (channel, row, col
// order: how the processor flattens a patch and how Conv2d lays out its filters). A composite
// of ops::matmul and ops::bias_add, which dispatch by device themselves.
#pragma once

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

struct PatchEmbedParams {
  int64_t patches = 0, channels = 3, patch = 14, hidden = 0;
  int64_t patch_dim() const { return channels * patch * patch; }
};

// pixels [patches, channels * patch^2] or [patches, channels, patch, patch]; w [hidden, channels,
// patch, patch] (HF layout) or [hidden, patch_dim]; b [hidden]; y [patches, hidden] written.
void patch_embed_forward(Context& ctx, const PatchEmbedParams& p, const Tensor& pixels,
                         const Tensor& w, const Tensor& b, Tensor& y);
// dw, db accumulate (each skipped when undefined: a frozen embedding); dpixels written when
// defined (pixels are data, so training leaves it undefined).
void patch_embed_backward(Context& ctx, const PatchEmbedParams& p, const Tensor& pixels,
                          const Tensor& w, const Tensor& dy, Tensor& dpixels, Tensor& dw,
                          Tensor& db);

}  // namespace mt::ops
