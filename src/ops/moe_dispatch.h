// Token dispatch for routed experts: the (token, slot) pairs of a step are sorted by expert so
// each expert sees one contiguous block of rows (what a grouped GEMM and an all-to-all want).
//
// Pair (t, j) is the flat slot t*k + j of ids [T,k]. The plan:
//   perm    i32 [T*k]: perm[p] = the slot placed at row p (sorted by expert, stable in slot order)
//   inv     i32 [T*k]: inv[t*k + j] = the row of slot (t, j)
//   offsets i32 [E+1]: rows of expert e are [offsets[e], offsets[e+1]); empty experts are fine.
// Activation gradients are written (=); the gather backward may add into dx on request.
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace mt::ops {

using MoeDispatchPlan = void(Context& ctx, const Tensor& ids, int64_t experts, Tensor& perm,
                             Tensor& inv, Tensor& offsets);
MoeDispatchPlan moe_dispatch_plan;

// rows[p] = x[perm[p] / k]; x [T, w], rows [T*k, w] (on the GPU rows may be row-pitched: the
// first w columns of the experts' K-concatenated input, ops/grouped_ffn.h).
using MoeGather = void(Context& ctx, const Tensor& x, const Tensor& perm, int64_t top_k,
                       Tensor& rows);
MoeGather moe_gather;
// dx[t] = sum_j drows[inv[t*k + j]]; written, or added when accumulate. Declared as a plain
// function so the default stays on the entry; the backends share its type.
void moe_gather_backward(Context& ctx, const Tensor& drows, const Tensor& inv, int64_t top_k,
                         Tensor& dx, bool accumulate = false);
using MoeGatherBackward = decltype(moe_gather_backward);

// y[t] = sum_j weights[t, j] * rows[inv[t*k + j]]; rows [T*k, w] in expert order, y [T, w].
using MoeCombine = void(Context& ctx, const Tensor& rows, const Tensor& weights, const Tensor& inv,
                        Tensor& y);
MoeCombine moe_combine;
// drows[inv[t*k+j]] = weights[t,j] * dy[t], dweights[t,j] = <dy[t], rows[inv[t*k+j]]>; both
// written (on the GPU drows may be row-pitched, as moe_gather's rows).
using MoeCombineBackward = void(Context& ctx, const Tensor& rows, const Tensor& weights,
                                const Tensor& inv, const Tensor& dy, Tensor& drows,
                                Tensor& dweights);
MoeCombineBackward moe_combine_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/moe_dispatch.cpp,
// and ops/cuda/moe_dispatch.cu in CUDA builds.
namespace cpu {
MoeDispatchPlan moe_dispatch_plan;
MoeGather moe_gather;
MoeGatherBackward moe_gather_backward;
MoeCombine moe_combine;
MoeCombineBackward moe_combine_backward;
}  // namespace cpu
namespace cuda {
MoeDispatchPlan moe_dispatch_plan;
MoeGather moe_gather;
MoeGatherBackward moe_gather_backward;
MoeCombine moe_combine;
MoeCombineBackward moe_combine_backward;
}  // namespace cuda

}  // namespace mt::ops
