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

// The fp32 dot product of the attention and indexer scores.
inline float dotf(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// An index table's slot holds a key position, or -1 past a row's candidates.
inline bool valid_slot(int32_t s, int64_t tokens) {
  return s >= 0 && s < tokens;
}

}  // namespace mt::ops::cpu
