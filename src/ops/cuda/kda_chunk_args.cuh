// The argument block every chunked-KDA kernel takes (ops/cuda/kda_chunk.cu builds it; the
// tensor-core state passes of ops/cuda/kda_state_tc.cu read it too): the chunk table, the
// prepared blocks (ops/kda_chunk_layout.h), the backward's own blocks and the op's tensors.
#pragma once

#include <cstdint>

#include "ops/kda_chunk_layout.h"

namespace mt::ops::cuda::kda_detail {

struct Args {
  int64_t T, H, N, nchunks;
  int C, K, V;
  float scale;
  // KdaParams::keep_for_backward: false lets the tensor-core forward skip what only backward
  // reads (the chunk states in `saved`; the prepared block's T, KK and Kb).
  bool keep = true;
  KdaChunkLayout lay;
  int64_t block;           // prepared floats per (chunk, head)
  const int32_t* ct0;      // [nchunks] first token of each chunk
  const int32_t* clen;     // [nchunks] its length (0: unused row)
  const int32_t* dchunk0;  // [N + 1] first chunk of each document
  const int32_t* dorder;   // [N] documents by chunk count, longest first (ties by index)
  const int32_t* corder;   // [nchunks] the chunks of the documents in dorder's order, then unused
  const float *g, *beta, *h0, *dhT;
  float *ws, *back, *saved, *hT, *dS, *dh0, *dg, *dbeta;  // ws: the prepared blocks
  // The overlapped forward (kda_forward_overlap): per head, per chunk, nonzero once the prep has
  // written that (chunk, head)'s block ([H][nchunks], zeroed before the launches), then the count
  // of the state pass's finished blocks; null otherwise.
  int* ready = nullptr;
  __device__ float* blk(int64_t c, int64_t h) const { return ws + (c * H + h) * block; }
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
