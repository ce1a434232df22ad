// The KDA core in its chunked (WY) form on the GPU: the algorithm of ops/cpu/kda.cpp's chunked
// path, split so that only what is truly sequential runs chunk after chunk.
//
// Within a chunk of L <= C tokens, Gam = inclusive cumsum of g (double, as on the CPU: exponents
// are differences of cumsums that reach the thousands under strong decay), S0 the state entering:
//   Aqk = scale q k^T e^(Gam_i - Gam_j) (j <= i), KK = k k^T e^(Gam_i - Gam_j) (j < i),
//   T = (I + diag(beta) KK)^-1, W = T (beta k e^Gam), U = T (beta v),
//   Delta = U - W S0,  o = (scale q e^Gam) S0 + Aqk Delta,
//   S_next = diag(e^Gam_L) S0 + (k e^(Gam_L - Gam))^T Delta.
// Forward: (1) prep, one block per (chunk, head), builds everything that does not depend on S0
// (pairwise terms with one exponential per pair and channel, never a factorised e^Gam e^-Gam that
// could overflow; for bf16 at chunk 64 and K 128 the pairs across 16-row blocks are tf32 MMAs of
// factors bounded by one, prep_block_pairs) into the workspace (ops/kda_chunk_layout.h); (2) state,
// one block per (document, head, 32 state columns), walks the document's chunks: the columns of S
// evolve independently, one per lane, so the state pass needs no cross-block reduction. Backward:
// prep again; (3) the reverse state pass carries dS (again per column) and leaves Delta, dR = T^T
// dDelta and each chunk's outgoing dS in the workspace; (4) products, per (chunk, head, job): dO
// S0^T, dR S0^T, Delta dS^T, S0 . dS and the pair matrices dO Delta^T, dR Delta^T, tiled through
// shared memory (for bf16 where the tensor-core prep runs, tf32 MMAs in kda_bwd_tc.cu); (5)
// gradients, per (chunk, head): one thread per (token, channel) sums its pair terms in a fixed
// order (no atomics: bit-repeatable; for bf16 at chunk 64 and K 128 the pairs across 16-row blocks
// are tf32 MMAs, grads_block_pairs, and a block takes half of the channels, dbeta_sum_kernel adding
// the halves' dbeta shares; grads_v2_kernel, the default there, takes the pairs inside the blocks
// onto tensor cores too) and the reverse cumsum turns dGam into dg. fp32 arithmetic (q,
// k, v, o and their gradients in the tensors' dtype), exponent differences and dGam sums in Wide<T>
// (double for fp32 tensors, float for bf16). For bf16 tensors whose shapes fit (kda_state_tc.h) the
// state passes (2, 3) run on tensor cores instead (kda_state_tc_fwd.cu, kda_state_tc_bwd.cu); fp32
// tensors keep the CUDA-core passes (kda_chunk_state.cu). The prep and gradient kernels run 2
// blocks of 8 warps per SM (the gradient kernel's fp32 form, with double Gam, 1), the CUDA-core
// state passes one block of 16 warps per (document, head, 32 columns): all are latency-bound
// (bench/RESULTS.md).
//
// This file holds the entries (kda_chunk.h), the argument block (make_args) and the chunk table;
// the CUDA-core kernels of the steps, each with its launcher, are in kda_chunk_prep.cu (1),
// kda_chunk_state.cu (2, 3), kda_chunk_products.cu (4), kda_chunk_grads.cu and
// kda_chunk_grads_v2.cu (5), what they share in kda_chunk_common.cuh.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_bwd_tc.h"
#include "ops/cuda/kda_chunk.h"
#include "ops/cuda/kda_chunk_args.cuh"
#include "ops/cuda/kda_chunk_common.cuh"
#include "ops/cuda/kda_fwd_tc.h"
#include "ops/cuda/kda_state_tc.h"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda {

namespace {

using kda_detail::Args;

// The chunks of each document, in saved-row order (as kda_saved_rows counts them), the documents
// by chunk count, longest first (dorder; ties by index), the order in which the state passes take
// them (kda_state_tc_fwd.cu), and their chunks in that order (corder: the overlapped forward's
// prep). Thread 0 walks the documents (few), then every thread fills its share of each document's
// chunks and ranks its documents.
__global__ void chunk_table_kernel(const int32_t* cu, int64_t N, int64_t T, int C, int64_t nchunks,
                                   int32_t* ct0, int32_t* clen, int32_t* dchunk0, int32_t* dorder,
                                   int32_t* corder) {
  const auto valid = [&](int64_t n) {  // validated on the host; never read out of range
    const int64_t a = cu[n], b = cu[n + 1];
    return !(a < 0 || b < a || b > T);
  };
  if (threadIdx.x == 0) {
    int64_t c = 0;
    for (int64_t n = 0; n < N; ++n) {
      dchunk0[n] = static_cast<int32_t>(c);
      if (valid(n)) c = std::min<int64_t>(nchunks, c + (cu[n + 1] - cu[n] + C - 1) / C);
    }
    dchunk0[N] = static_cast<int32_t>(c);
  }
  __syncthreads();
  for (int64_t n = 0; n < N; ++n) {
    if (!valid(n)) continue;
    const int64_t b = cu[n + 1], c0 = dchunk0[n], nc = dchunk0[n + 1] - c0;
    for (int64_t j = threadIdx.x; j < nc; j += blockDim.x) {
      const int64_t t = cu[n] + j * C;
      ct0[c0 + j] = static_cast<int32_t>(t);
      clen[c0 + j] = static_cast<int32_t>(b - t < C ? b - t : C);
    }
  }
  for (int64_t c = dchunk0[N] + threadIdx.x; c < nchunks; c += blockDim.x) ct0[c] = clen[c] = 0;
  // Each document's rank and the chunks of the documents ranked before it, by one quadratic count:
  // at most kRankedDocs documents (a packed batch has tens); past that, the documents' own order.
  // dorder[rank] is the document; corder lists its chunks from there, then the unused rows.
  constexpr int64_t kRankedDocs = 4096;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const int32_t len = dchunk0[n + 1] - dchunk0[n];
    int64_t rank = n, at = dchunk0[n];
    if (N <= kRankedDocs) {
      rank = at = 0;
      for (int64_t m = 0; m < N; ++m) {
        const int32_t lm = dchunk0[m + 1] - dchunk0[m];
        if (lm > len || (lm == len && m < n)) {
          ++rank;
          at += lm;
        }
      }
    }
    dorder[rank] = static_cast<int32_t>(n);
    for (int32_t j = 0; j < len; ++j) corder[at + j] = dchunk0[n] + j;
  }
  for (int64_t c = dchunk0[N] + threadIdx.x; c < nchunks; c += blockDim.x)
    corder[c] = static_cast<int32_t>(c);
}

// `prepared`: the caller's prepared blocks (undefined: they go to the workspace).
Args make_args(Context& ctx, const KdaParams& p, const Tensor& cu, const Tensor& q, const Tensor& g,
               const Tensor& beta, int64_t nchunks, bool backward, const Tensor& prepared,
               Tensor& space) {
  Args a{};
  a.T = p.tokens;
  a.H = p.heads;
  a.N = p.num_seqs;
  a.nchunks = nchunks;
  a.C = static_cast<int>(p.chunk);
  a.K = static_cast<int>(p.head_k);
  a.V = static_cast<int>(p.head_v);
  a.scale = p.qk_scale();
  const bool kept = prepared.defined();
  a.keep = backward || p.keep_for_backward;
  a.keep_block = backward || (p.keep_for_backward && kept);
  a.lay = kda_chunk_layout(p, q.dtype());
  a.kernels = p.kernels;
  a.block = a.lay.block();
  space =
      ctx.workspace().alloc({kda_chunk_workspace_floats(p, nchunks, backward, kept, q.dtype())});
  float* base = ptr<float>(space);
  int32_t* table = reinterpret_cast<int32_t*>(base);
  // In kda_chunk_table_ints's order; the ready flags (nchunks x heads + 1) after dchunk0 (N + 1).
  a.ct0 = table;
  a.clen = table + nchunks;
  a.dchunk0 = table + 2 * nchunks;
  a.dorder = a.dchunk0 + p.num_seqs + 1 + nchunks * p.heads + 1;
  a.corder = a.dorder + p.num_seqs;
  float* next = base + kda_chunk_table_ints(nchunks, p.num_seqs, p.heads);
  if (kept) {
    a.ws = const_cast<float*>(ptr<float>(prepared));
  } else {
    a.ws = next;
    next += nchunks * p.heads * a.block;
  }
  if (backward) {
    a.back = next;
    a.dS = a.back + nchunks * p.heads * a.lay.back_block();
  }
  a.g = ptr<float>(g);
  a.beta = ptr<float>(beta);
  chunk_table_kernel<<<1, 256, 0, stream(ctx)>>>(
      ptr<int32_t>(cu), p.num_seqs, p.tokens, a.C, nchunks, const_cast<int32_t*>(a.ct0),
      const_cast<int32_t*>(a.clen), const_cast<int32_t*>(a.dchunk0), const_cast<int32_t*>(a.dorder),
      const_cast<int32_t*>(a.corder));
  MT_CUDA_LAUNCH_CHECK();
  return a;
}

// The chunk states: fp32, or bf16 (the entries checked kda_bf16_states_fit, which implies the bf16
// prepared layout and with it the tensor-core state passes).
void set_saved(Args& a, const Tensor& saved) {
  if (saved.dtype() == DType::BF16) {
    MT_CHECK(a.lay.half, InternalError, "kda: bf16 chunk states off the bf16 prepared layout");
    a.saved_h = ptr<__nv_bfloat16>(saved);
  } else {
    a.saved = ptr<float>(saved);
  }
}

}  // namespace

void kda_chunk_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                       const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                       const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved, Tensor& prepared) {
  ArenaScope scope(ctx.workspace());
  Tensor space;
  Args a = make_args(ctx, p, cu_seqlens, q, g, beta, saved.dim(0), false, prepared, space);
  set_saved(a, saved);
  a.h0 = h0.defined() && h0.numel() ? ptr<float>(h0) : nullptr;
  a.hT = hT.defined() && hT.numel() ? ptr<float>(hT) : nullptr;
  MT_DISPATCH_FLOAT(q, "kda", {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      // The bf16 layout implies the tensor-core prep (prep<T> below) and state_tc_fits.
      if (const int blocks = kda_detail::forward_overlap_blocks(ctx, a)) {
        // The prep's persistent grid, then the state pass as its programmatic dependent, which
        // runs beside it on the flags the prep sets per (chunk, head), after the chunk table
        // (kda_forward_overlap).
        a.ready = const_cast<int32_t*>(a.dchunk0) + p.num_seqs + 1;
        MT_CUDA_CHECK(
            cudaMemsetAsync(a.ready, 0, sizeof(int32_t) * (a.nchunks * a.H + 1), stream(ctx)));
        kda_detail::prep_tc(ctx, a, ptr<__nv_bfloat16>(q), ptr<__nv_bfloat16>(k),
                            ptr<__nv_bfloat16>(v), blocks);
        return kda_detail::forward_state_tc_follow(ctx, a, ptr<__nv_bfloat16>(o));
      }
    }
    kda_chunk::prep<T>(ctx, a, q, k, v);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (kda_detail::state_tc_fits(a))
        return kda_detail::forward_state_tc(ctx, a, ptr<__nv_bfloat16>(o));
    }
    // The CUDA-core passes read the fp32 layout only; the bf16 one implies state_tc_fits.
    MT_CHECK(!a.lay.half, ValueError, "kda_forward: bf16 prepared layout without tensor cores");
    kda_chunk::forward_state<T>(ctx, a, ptr<T>(o));
  });
}

void kda_chunk_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const Tensor& saved, Tensor& prepared, const Tensor& dout,
                        const Tensor& dhT, Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg,
                        Tensor& dbeta, Tensor& dh0) {
  ArenaScope scope(ctx.workspace());
  Tensor space;
  Args a = make_args(ctx, p, cu_seqlens, q, g, beta, saved.dim(0), true, prepared, space);
  set_saved(a, saved);
  a.dhT = dhT.defined() && dhT.numel() ? ptr<float>(dhT) : nullptr;
  a.dh0 = dh0.defined() && dh0.numel() ? ptr<float>(dh0) : nullptr;
  a.dg = ptr<float>(dg);
  a.dbeta = ptr<float>(dbeta);
  // The bf16 states imply the bf16 layout and with it the tensor-core prep (prep<T> below).
  a.fuse_delta = a.kernels.fused_delta && a.kernels.prep_v2 && a.saved_h && !prepared.defined();
  a.fuse_pre =
      a.fuse_delta && a.kernels.fused_pre && reinterpret_cast<uintptr_t>(dout.raw()) % 16 == 0;
  if (a.fuse_pre) a.dout = ptr<__nv_bfloat16>(dout);
  MT_DISPATCH_FLOAT(q, "kda", {
    if (!prepared.defined()) kda_chunk::prep<T>(ctx, a, q, k, v);
    bool tensor_cores = false;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) tensor_cores = kda_detail::state_tc_fits(a);
    MT_CHECK(tensor_cores || !a.lay.half, ValueError,
             "kda_backward: bf16 prepared layout without tensor cores");
    if (tensor_cores)
      kda_detail::backward_state_tc(ctx, a, ptr<__nv_bfloat16>(dout));
    else
      kda_chunk::backward_state<T>(ctx, a, ptr<T>(dout));
    bool tc_products = false;
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      tc_products = kda_detail::products_tc_fits(a, dout.raw());
    if (tc_products)
      kda_detail::products_tc(ctx, a, ptr<__nv_bfloat16>(dout));
    else
      kda_chunk::products<T>(ctx, a, ptr<T>(dout));
    kda_chunk::grads<T>(ctx, a, q, k, v, dq, dk, dv);
  });
}

}  // namespace mt::ops::cuda
