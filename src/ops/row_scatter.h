// Rows of one tensor written over chosen rows of another: how a kimi_k25 model puts the
// projector's image rows in place of the placeholder tokens' embeddings (transformers'
// masked_scatter). An op rather than a host loop so that it runs where the embeddings live.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct RowScatterParams {
  int64_t rows = 0;      // rows of src (and entries of index)
  int64_t dst_rows = 0;  // rows of dst
  int64_t dim = 0;
};

// dst[index[k], :] = src[k, :] for k < rows; the other rows of dst are left as they are.
// index i32 [rows], distinct entries in [0, dst_rows) (checked on the host path; a CUDA call
// skips an entry out of range); src [rows, dim], dst [dst_rows, dim], contiguous.
using RowScatterForward = void(Context& ctx, const RowScatterParams& p, const Tensor& index,
                               const Tensor& src, Tensor& dst);
RowScatterForward row_scatter_forward;
// The gradient of that overwrite: dsrc[k] = ddst[index[k]] (written), then ddst[index[k]] = 0
// in place (the overwritten rows' old values never reach the output).
using RowScatterBackward = void(Context& ctx, const RowScatterParams& p, const Tensor& index,
                                Tensor& ddst, Tensor& dsrc);
RowScatterBackward row_scatter_backward;

// Reads index (host memory): a ValueError "<what>[k] = v is out of range or repeated (<dst_rows>
// <unit>)" unless its p.rows entries are distinct and in [0, p.dst_rows). A repeated entry would
// make the forward depend on write order and the backward read a row already cleared.
void check_row_index(const RowScatterParams& p, const Tensor& index, const char* what,
                     const char* unit);

// The backends' bodies, called by the entries above once they validated: ops/cpu/row_scatter.cpp,
// and ops/cuda/row_scatter.cu in CUDA builds (also patch_merge_backward's, a scatter by `order`).
MT_OP_BACKENDS(RowScatterForward row_scatter_forward; RowScatterBackward row_scatter_backward;)

}  // namespace mt::ops
