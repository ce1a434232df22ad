// Decoding over a cache: n new query rows attend to keys cached at absolute positions of one
// document, and the DSA lightning indexer picks each new row's top-k among the cached positions.
// ops::attention_forward and ops::indexer_causal_topk want queries and keys of one packed batch
// (key positions below the query count), which a cache is not: here the queries are the last n
// positions of a document whose first `cached` positions have keys.
//
// Layout: q [n, H, Dqk]; the caches k [capacity, H, Dqk], v [capacity, H, Dv] (per-head keys, as
// MLA after kv_b), of which rows [0, cached) hold keys; positions i32 [n] the absolute position of
// each query (its own key is cached too: positions[i] < cached). Storage f32 or bf16 (one type per
// call), arithmetic in fp32. The host path refuses a position outside [0, cached) (ValueError); the
// device path does not read them on the host, and clamps a row's key count to [0, cached] instead,
// so a bad position never reads or writes outside the cache and the row.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/backends.h"

namespace mt::ops {

struct CachedAttentionParams {
  int64_t tokens = 0, heads = 0;  // n query rows, H heads
  int64_t qk_dim = 0, v_dim = 0;
  int64_t cached = 0;  // cache rows holding keys (positions [0, cached))
  int64_t kmax = 0;    // slots per row of `indices` (when defined)
  float scale = 0;     // softmax scale, applied to q.k
};

// o [n, H, Dv] = softmax(scale q.k) v over row i's keys: the listed positions of indices
// i32 [n, kmax] (a slot outside [0, cached) is unused, a duplicate counts twice) or, when indices
// is undefined, every position 0 .. positions[i] (dense causal). A row without keys gets o = 0.
// Written.
// Whether the CUDA body takes these head widths: a block keeps the query row, one value row per
// warp (kCachedAttentionWarps) and the warps' running max and sum in fp32 within the 48 KiB of
// shared memory a block gets without opting in. Read by the CUDA body, the op table and the
// Decoder (which refuses a model the GPU cannot decode before it allocates a cache).
inline constexpr int kCachedAttentionWarps = 4;
bool cached_attention_fits(int64_t qk_dim, int64_t v_dim);
using CachedAttentionForward = void(Context& ctx, const CachedAttentionParams& p, const Tensor& q,
                                    const Tensor& k, const Tensor& v, const Tensor& positions,
                                    const Tensor& indices, Tensor& o);
CachedAttentionForward cached_attention_forward;

struct CachedIndexerParams {
  int64_t tokens = 0, heads = 0, head_dim = 0;  // n query rows, HI indexer heads of DI
  int64_t cached = 0;                           // cache rows holding indexer keys
  int64_t topk = 0;
  float scale = 0;  // 0: head_dim^-0.5
};

// The lightning indexer over a cache (ops/indexer.h has the score): for row i, the
// min(topk, positions[i] + 1) positions s <= positions[i] with the largest
//   I[i, s] = scale * sum_h w[i, h] * ReLU(q[i, h, :] . k[s, :]),
// ties to the lower position, listed in increasing order, then -1: out i32 [n, topk] (written).
// q [n, HI, DI], k [capacity, DI] (rows [0, cached) used), w [n, HI]. The GPU keeps an fp32
// [n, cached] score table in the workspace: a step whose table does not fit is a ValueError naming
// both sizes (a long prompt decodes in shorter steps).
// The same for the indexer's score kernel: the row's query heads and head weights in fp32.
bool cached_indexer_fits(int64_t heads, int64_t head_dim);
using CachedIndexerTopk = void(Context& ctx, const CachedIndexerParams& p, const Tensor& q,
                               const Tensor& k, const Tensor& w, const Tensor& positions,
                               Tensor& out);
CachedIndexerTopk cached_indexer_topk;

// The backends' bodies, called by the entries above once they validated:
// ops/cpu/cached_attention.cpp, and ops/cuda/cached_attention.cu in CUDA builds.
MT_OP_BACKENDS(CachedAttentionForward cached_attention_forward;
               CachedIndexerTopk cached_indexer_topk;)

}  // namespace mt::ops
