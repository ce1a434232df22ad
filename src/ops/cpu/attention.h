// CPU-only helpers of ops/attention.h's fp32 loops (the backend bodies are declared there).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

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

// One candidate of an indexer top-k: 8 bytes, so that a row's list fits one i64 workspace row.
struct ScoredPos {
  float score;
  int32_t pos;
};
static_assert(sizeof(ScoredPos) == 8);

// The selection rule of every indexer top-k (ops::topk_select, ops::cached_indexer_topk): the
// min(topk, cand.size()) candidates of largest score, equal scores to the lower position (a strict
// weak order even with duplicate positions, which tie completely and are interchangeable), written
// to out in increasing position order, then -1 up to topk. Reorders cand.
inline void select_topk_row(std::span<ScoredPos> cand, int64_t topk, int32_t* out) {
  auto better = [](const ScoredPos& a, const ScoredPos& b) {
    return a.score > b.score || (a.score == b.score && a.pos < b.pos);
  };
  const size_t keff = std::min(cand.size(), static_cast<size_t>(topk));
  if (keff < cand.size())
    std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keff), cand.end(),
                     better);
  for (size_t i = 0; i < keff; ++i) out[i] = cand[i].pos;
  std::sort(out, out + keff);
  for (int64_t i = static_cast<int64_t>(keff); i < topk; ++i) out[i] = -1;
}

// An index table's slot holds a key position, or -1 past a row's candidates.
inline bool valid_slot(int32_t s, int64_t tokens) {
  return s >= 0 && s < tokens;
}

}  // namespace mt::ops::cpu
