// The CPU path of ops/attention.h: fp32 loops. Called by the entries after they validated, so it
// does not re-check.
#pragma once

#include "core/arena.h"
#include "ops/attention.h"

namespace mt::ops::cpu {

// The transpose of an index table, for scatter-free backward passes: for key position s, the
// flat slots t * kmax + j whose index is s are entries[offsets[s] .. offsets[s + 1]), in
// increasing slot order. Both tensors are allocated from `arena`.
struct KeyLists {
  Tensor offsets;  // i64 [T + 1]
  Tensor entries;  // i64 [valid slots]
};
KeyLists build_key_lists(const Tensor& indices, int64_t tokens, Arena& arena);

void causal_indices(const SeqInfo& seq, Tensor& indices);
void full_indices(const SeqInfo& seq, Tensor& indices);
void attention_forward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& indices, Tensor& o, Tensor& lse);
void attention_backward(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& indices, const Tensor& o, const Tensor& lse,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);
void attention_prob_sum(Context& ctx, const AttentionParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& indices, const Tensor& lse, Tensor& out);

}  // namespace mt::ops::cpu
