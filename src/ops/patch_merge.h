// Spatial patch merging before the projector (kimi_k25's merge_kernel_size, 2x2): the kh * kw
// patches of each merge window become one token of kh * kw * dim features, window position
// (i, j) at feature block i * kw + j. Over packed raster-ordered images that is a row
// permutation: y[s] = x[order[s]] with `order` from ops::merge_order (vision_grid.h); y
// [patches, dim] read as [patches / (kh * kw), kh * kw * dim] is the merged sequence.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct PatchMergeParams {
  int64_t patches = 0, dim = 0;
};

// x, y [patches, dim]; order i32 [patches], a permutation (checked). y written.
using PatchMergeForward = void(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                               const Tensor& x, Tensor& y);
PatchMergeForward patch_merge_forward;
// dx[order[s]] = dy[s]: written (a permutation, so every row once).
using PatchMergeBackward = void(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                                const Tensor& dy, Tensor& dx);
PatchMergeBackward patch_merge_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/patch_merge.cpp,
// and ops/cuda/patch_merge.cu in CUDA builds. The backward is a row scatter by `order`, so it
// runs row_scatter's forward body (ops/row_scatter.h).
MT_OP_BACKENDS(PatchMergeForward patch_merge_forward;)

}  // namespace mt::ops
