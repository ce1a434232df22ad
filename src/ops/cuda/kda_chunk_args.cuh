// The argument block every chunked-KDA kernel takes (ops/cuda/kda_chunk.cu builds it; the
// tensor-core state passes of ops/cuda/kda_state_tc_fwd.cu and kda_state_tc_bwd.cu read it too):
// the chunk table, the prepared blocks (ops/kda_chunk_layout.h), the backward's own blocks and the
// op's tensors.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/kda_chunk_layout.h"
#include "ops/kda_kernels.h"

namespace mt::ops::cuda::kda_detail {

struct Args {
  int64_t T, H, N, nchunks;
  int C, K, V;
  float scale;
  // KdaParams::keep_for_backward: false lets the tensor-core forward skip the chunk states in
  // `saved`, which only backward reads.
  bool keep = true;
  // Whether the tensor-core prep writes the prepared block's backward-only parts (T, KK, Kb): in
  // backward, and in a training forward that leaves the block in the caller's `prepared` tensor;
  // not where the block dies with the forward's workspace (backward then prepares again).
  bool keep_block = true;
  // Backward's prep also does bwd_pre's work (ops/kda_prep_path.h): Delta = U - W S0 into the
  // backward's own block (fuse_delta, kda_fused_delta), and then E = Aqk^T dO into dR's place and
  // F = Qh^T dO into the chunk's dS slot (fuse_pre, kda_fused_pre: implies fuse_delta), so that
  // bwd_pre runs its second job only, or not at all. Where backward runs prep v2 (no `prepared`
  // kept) on bf16 chunk states; fuse_pre with `dout` (then set) 16-byte aligned.
  bool fuse_delta = false, fuse_pre = false;
  const __nv_bfloat16* dout = nullptr;
  KdaChunkLayout lay;
  KdaKernels kernels;      // KdaParams::kernels: which kernel of each pair the host launches
  int64_t block;           // prepared floats per (chunk, head)
  const int32_t* ct0;      // [nchunks] first token of each chunk
  const int32_t* clen;     // [nchunks] its length (0: unused row)
  const int32_t* dchunk0;  // [N + 1] first chunk of each document
  const int32_t* dorder;   // [N] documents by chunk count, longest first (ties by index)
  const int32_t* corder;   // [nchunks] the chunks of the documents in dorder's order, then unused
  const float *g, *beta, *h0, *dhT;
  float *ws, *back, *saved, *hT, *dS, *dh0, *dg, *dbeta;  // ws: the prepared blocks
  // The chunk states as bf16 (ops/kda_prep_path.h, kda_bf16_states_fit) in place of `saved`,
  // which is then null: the tensor-core forward state passes round to them, the backward's
  // tensor-core kernels (and the CUDA-core products) widen them exactly on load.
  __nv_bfloat16* saved_h = nullptr;
  // The overlapped forward (kda_forward_overlap): per head, per chunk, nonzero once the prep has
  // written that (chunk, head)'s block ([H][nchunks], zeroed before the launches), then the count
  // of the state pass's finished blocks; null otherwise.
  int* ready = nullptr;
  __device__ float* blk(int64_t c, int64_t h) const { return ws + (c * H + h) * block; }
  // The pair of chunk-state elements e, e + 1 (e even) into `saved` or `saved_h`, rounded to
  // nearest there.
  __device__ void put_states(int64_t e, float x, float y) const {
    if (saved_h)
      *reinterpret_cast<__nv_bfloat162*>(saved_h + e) = __floats2bfloat162_rn(x, y);
    else
      *reinterpret_cast<float2*>(saved + e) = make_float2(x, y);
  }
  // Where backward's products put Delta dS^T of (c, h) [C, K] (ops/kda_chunk_layout.h): Kl's
  // place, or with the bf16 layout the chunk's outgoing-dS slot, which only that product reads.
  __device__ float* dds(int64_t c, int64_t h) const {
    return lay.half ? dS + (c * H + h) * K * V : blk(c, h) + lay.Kl();
  }
  // Backward's Delta and dR of (c, h).
  __device__ float* bblk(int64_t c, int64_t h) const {
    return back + (c * H + h) * lay.back_block();
  }
};

}  // namespace mt::ops::cuda::kda_detail
