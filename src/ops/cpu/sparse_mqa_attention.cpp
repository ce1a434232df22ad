// The CPU body is the per-head composite: attention over index lists with one key head is
// already the fp32 reference body (ops/cpu/attention.cpp), so the absorbed form adds no loops.
#include "ops/sparse_mqa_attention.h"

namespace mt::ops::cpu {

void sparse_mqa_forward(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                        const Tensor& indices, Tensor& o, Tensor& lse) {
  sparse_mqa_composite_forward(ctx, p, q, kv, indices, o, lse);
}

void sparse_mqa_backward(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                         const Tensor& indices, const Tensor& o, const Tensor& lse,
                         const Tensor& dout, Tensor& dq, Tensor& dkv, Tensor& prob_sum) {
  sparse_mqa_composite_backward(ctx, p, q, kv, indices, o, lse, dout, dq, dkv, prob_sum);
}

void sparse_mqa_prob_sum(Context& ctx, const SparseMqaParams& p, const Tensor& q, const Tensor& kv,
                         const Tensor& indices, const Tensor& lse, Tensor& out) {
  sparse_mqa_composite_prob_sum(ctx, p, q, kv, indices, lse, out);
}

}  // namespace mt::ops::cpu
