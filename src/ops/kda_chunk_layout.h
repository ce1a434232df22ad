// The chunked KDA kernels' workspace (ops/cuda/kda_chunk*.cu), shared with the host code that
// sizes it (ops/kda.cpp, read by the planner), so the two cannot disagree.
//
// Per (chunk, head) one block of floats holds what the chunk's intra-chunk pass (prep) prepares
// for the sequential state pass, C = chunk, K = head_k, V = head_v:
//   W = T Kb [C, K], Qh = scale q e^Gam [C, K], Kl = k e^(Gam_L - Gam) [C, K], U = T beta v [C, V],
//   Kb = beta k e^Gam [C, K], Aqk [C, C], T = (I + diag(beta) KK)^-1 [C, C], KK [C, C],
//   gL = e^Gam_L [K].
// `half` (the bf16 tensor-core path; ops/kda_prep_path.h's kda_chunk_layout chooses): W, Qh, Kl,
// U and Kb, the large operands that only ever enter tf32 MMAs, are stored as bf16 (two per float
// of the block, offsets still in floats); Aqk, T, KK and gL stay fp32 (see docs/gpu.md, "KDA core,
// chunked kernels", for why each): 132 KB in place of 213 KB per (chunk, head) at C 64, K = V =
// 128.
// It lives in the workspace, or in the caller's `prepared` tensor that carries it from forward
// to backward (ops/kda.h), which then skips prep. Backward's Delta [C, V] and dR [C, V] per
// (chunk, head) have a block of their own, and backward's gradient pass reuses the prepared block
// (dead by then but for KK): dO S0^T at dOS0(), dR S0^T at dRS0() (fp32 [C, K] each), Delta dS^T in
// Kl's place (fp32 layout) or in the chunk's outgoing-dS slot of the workspace (half: the block
// has no room for a third fp32 [C, K]; V >= C, so the slot's K V floats hold C K), Aqk and T the
// pair terms, gL S0 . dS, and the dbeta shares of the gradient kernel's channel halves at
// dbeta_parts().
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace mt::ops {

struct KdaChunkLayout {
  int64_t C, K, V;
  bool half = false;  // W, Qh, Kl, U, Kb as bf16
  // Floats that n elements of W, Qh, Kl, U or Kb take (C K and C V are even where half holds).
  MT_HD int64_t big(int64_t n) const { return half ? n / 2 : n; }
  MT_HD int64_t W() const { return 0; }
  MT_HD int64_t Qh() const { return big(C * K); }
  MT_HD int64_t Kl() const { return 2 * big(C * K); }
  MT_HD int64_t U() const { return 3 * big(C * K); }
  MT_HD int64_t Kb() const { return 3 * big(C * K) + big(C * V); }
  MT_HD int64_t Aqk() const { return 4 * big(C * K) + big(C * V); }
  MT_HD int64_t Tm() const { return Aqk() + C * C; }
  MT_HD int64_t KK() const { return Tm() + C * C; }
  MT_HD int64_t gL() const { return KK() + C * C; }
  MT_HD int64_t block() const { return gL() + K; }  // the prepared floats per (chunk, head)
  // Backward's products in the prepared block (fp32; see above). half: [0, 2 C K) and the dbeta
  // shares after it lie below Aqk (2 C K + C V / 2) for V >= 4 (two shares of C floats).
  MT_HD int64_t dOS0() const { return 0; }
  MT_HD int64_t dRS0() const { return C * K; }
  MT_HD int64_t dbeta_parts() const { return half ? 2 * C * K : U(); }
  // Backward's own block per (chunk, head).
  MT_HD int64_t D() const { return 0; }
  MT_HD int64_t dR() const { return C * V; }
  MT_HD int64_t back_block() const { return 2 * C * V; }
};

// The chunk table ahead of the chunked kernels' workspace (ops/kda.cpp sizes it, ops/cuda/
// kda_chunk.cu's make_args lays it out), i32 entries: per chunk its first token and its length;
// per document its first chunk, and the end; the overlapped forward's ready flag per (chunk, head)
// and their count; the documents longest first, and their chunks in that order. Padded to 16.
inline int64_t kda_chunk_table_ints(int64_t chunks, int64_t docs, int64_t heads) {
  return (3 * chunks + 2 * docs + 2 + chunks * heads + 15) / 16 * 16;
}

}  // namespace mt::ops

#undef MT_HD
