// The chunked KDA kernels' workspace (ops/cuda/kda_chunk.cu), shared with the host code that sizes
// it (ops/kda.cpp, read by the planner), so the two cannot disagree.
//
// Per (chunk, head) one block of floats holds what the chunk's intra-chunk pass prepares for the
// sequential state pass, C = chunk, K = head_k, V = head_v:
//   W = T Kb [C, K], Qh = scale q e^Gam [C, K], Kl = k e^(Gam_L - Gam) [C, K], U = T beta v [C, V],
//   Kb = beta k e^Gam [C, K], Aqk [C, C], T = (I + diag(beta) KK)^-1 [C, C], KK [C, C],
//   gL = e^Gam_L [K]; backward adds Delta [C, V] and dR [C, V].
// The backward's gradient pass reuses W, Qh and Kl for its products dO S0^T, dR S0^T and
// Delta dS^T, Aqk and T for the pair terms, gL for S0 . dS, and U + Kb (contiguous) as scratch.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MT_HD __host__ __device__
#else
#define MT_HD
#endif

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
  MT_HD int64_t D() const { return gL() + K; }
  MT_HD int64_t dR() const { return D() + C * V; }
  MT_HD int64_t block(bool backward) const { return backward ? dR() + C * V : D(); }
};

}  // namespace mt::ops

#undef MT_HD
