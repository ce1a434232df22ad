// CPU-only helpers of ops/attention.h's fp32 loops (the backend bodies are declared there).
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

}  // namespace mt::ops::cpu
