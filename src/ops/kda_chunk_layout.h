// The chunked KDA kernels' workspace (ops/cuda/kda_chunk.cu), shared with the host code that sizes
// it (ops/kda.cpp, read by the planner), so the two cannot disagree.
//
// Per (chunk, head) one block of floats holds what the chunk's intra-chunk pass (prep) prepares
// for the sequential state pass, C = chunk, K = head_k, V = head_v:
//   W = T Kb [C, K], Qh = scale q e^Gam [C, K], Kl = k e^(Gam_L - Gam) [C, K], U = T beta v [C, V],
//   Kb = beta k e^Gam [C, K], Aqk [C, C], T = (I + diag(beta) KK)^-1 [C, C], KK [C, C],
//   gL = e^Gam_L [K].
// It lives in the workspace, or in the caller's `prepared` tensor that carries it from forward
// to backward (ops/kda.h), which then skips prep. Delta [C, V] and dR [C, V] per (chunk, head) have
// a block of their own (forward's tensor-core pass keeps Delta there for its output pass; the
// backward, for its gradient pass), and backward's gradient pass reuses the prepared block: W, Qh
// and Kl receive its products dO S0^T, dR S0^T and Delta dS^T, Aqk and T the pair terms, gL S0 .
// dS, and U + Kb (contiguous) serve as scratch.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace mt::ops {

struct KdaChunkLayout {
  int64_t C, K, V;
  MT_HD int64_t W() const { return 0; }
  MT_HD int64_t Qh() const { return C * K; }
  MT_HD int64_t Kl() const { return 2 * C * K; }
  MT_HD int64_t U() const { return 3 * C * K; }
  MT_HD int64_t Kb() const { return 3 * C * K + C * V; }
  MT_HD int64_t Aqk() const { return 4 * C * K + C * V; }
  MT_HD int64_t Tm() const { return Aqk() + C * C; }
  MT_HD int64_t KK() const { return Tm() + C * C; }
  MT_HD int64_t gL() const { return KK() + C * C; }
  MT_HD int64_t block() const { return gL() + K; }  // the prepared floats per (chunk, head)
  // Backward's own block per (chunk, head).
  MT_HD int64_t D() const { return 0; }
  MT_HD int64_t dR() const { return C * V; }
  MT_HD int64_t back_block() const { return 2 * C * V; }
};

}  // namespace mt::ops

#undef MT_HD
