// Kimi Delta Attention core: the gated delta rule with a per-channel (diagonal) decay.
//
// Per document, per head, with state S [K, V] (rows are key channels), token by token:
//   S <- diag(exp(g_t)) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T (scale q_t).
// Layout is head-last: q, k, g [T, H, K]; v, o [T, H, V]; beta [T, H]. Documents are packed and
// delimited by cu_seqlens (i32 [N + 1]); each starts from its own h0 [N, H, K, V] (undefined:
// zeros) and leaves its final state in hT [N, H, K, V]. g is a log decay and must be <= 0 (the
// chunked form relies on it: every exponent it takes is then non-positive).
//
// Two algorithms with one signature: the token-by-token recurrence (saves the state entering
// every token, [T, H, K, V]) and the chunked WY form (saves the state entering every chunk,
// [chunks, H, K, V], and recomputes the rest in backward). Documents never share a chunk.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/kda_kernels.h"

namespace mt::ops {

struct KdaParams {
  int64_t tokens = 0, heads = 0, head_k = 0, head_v = 0;
  int64_t num_seqs = 0;  // N: cu_seqlens has N + 1 entries
  float scale = 0.f;     // 0: head_k^-0.5
  bool chunked = true;   // false: token-by-token recurrence
  int64_t chunk = 64;    // chunk length of the chunked form; a document's last chunk may be shorter
  // False: no backward will read this forward's `saved` or `prepared` (an evaluation), so the
  // forward may skip writing them (the GPU's tensor-core path then writes neither the chunk states
  // nor the prepared block's backward-only parts); o and hT are the same bits either way. A
  // training forward without a `prepared` tensor skips the latter too (backward prepares again).
  bool keep_for_backward = true;
  KdaKernels kernels;
  float qk_scale() const;
};

// Leading dimension of the `saved` tensor [rows, heads, head_k, head_v] for these documents:
// tokens (recurrent) or the number of chunks (chunked).
int64_t kda_saved_rows(const KdaParams& p, const Tensor& cu_seqlens);

// Floats of scratch kda_forward (backward = false) or kda_backward takes from the workspace on
// `threads` threads (per-thread buffers and the document tables), for memory planning (the ops
// allocate exactly this).
using KdaScratchFloats = int64_t(const KdaParams& p, int threads, bool backward);
KdaScratchFloats kda_scratch_floats;

// Whether the CUDA chunked kernels (ops/cuda/kda_chunk*.cu) take these params: the chunked
// algorithm with chunk <= 64 and head dims <= 128, unless p.kernels.chunk_kernels is off. Read by
// the CUDA entries, the op table and the planner.
bool kda_chunk_kernel_fits(const KdaParams& p);
// Floats of workspace the CUDA chunked kernels take for `chunks` saved rows and q, k, v of
// `dtype` (ops/kda_chunk_layout.h), for memory planning (the kernels allocate exactly this);
// `prepared`: the caller passes a prepared tensor (below), which then holds what the workspace
// would.
int64_t kda_chunk_workspace_floats(const KdaParams& p, int64_t chunks, bool backward, bool prepared,
                                   DType dtype);
// Floats of the `prepared` tensor for `chunks` saved rows and q, k, v of `dtype`: the CUDA
// chunked kernels' intra-chunk products (ops/kda_chunk_layout.h), about 3.3 times the chunk
// states at C 64, K = V = 128 (bf16 on the tensor-core path; fp32: 5.2 times).
int64_t kda_prepared_floats(const KdaParams& p, int64_t chunks, DType dtype);

// o written; hT written when defined; h0 may be undefined (zero initial states); saved receives
// what backward needs and must stay untouched until then: f32, or bf16 where the GPU's
// tensor-core path takes these params (kda_bf16_states_fit in ops/kda_prep_path.h; the chunk
// states then rounded to bf16, half the bytes; kda_saved_dtype chooses). prepared: undefined, or
// f32
// [kda_prepared_floats(p, saved rows, q's dtype)] on the op's device where kda_chunk_kernel_fits:
// the CUDA chunked kernels' intra-chunk products, which forward leaves there and backward reads
// instead of computing them again (and then overwrites: one backward per forward). The CPU ignores
// it.
using KdaForward = void(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved, Tensor& prepared);
KdaForward kda_forward;

// All gradients are written (=): dq, dk, dv, dg, dbeta, and dh0 when defined. dhT may be
// undefined (the final state does not reach the loss).
using KdaBackward = void(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens,
                         const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, const Tensor& saved, Tensor& prepared,
                         const Tensor& dout, const Tensor& dhT, Tensor& dq, Tensor& dk, Tensor& dv,
                         Tensor& dg, Tensor& dbeta, Tensor& dh0);
KdaBackward kda_backward;

// The backends' bodies, called by the entries above once they validated: ops/cpu/kda.cpp, and
// ops/cuda/kda.cu in CUDA builds. cpu::kda_scratch_floats sizes the CPU path's per-thread chunk
// buffers.
namespace cpu {
KdaScratchFloats kda_scratch_floats;
KdaForward kda_forward;
KdaBackward kda_backward;
}  // namespace cpu
namespace cuda {
KdaForward kda_forward;
KdaBackward kda_backward;
}  // namespace cuda

}  // namespace mt::ops
