// The forward forms' mainloop: CUTLASS's pointer-array TMA + wgmma mainloop, except that the last
// k-tile issues only the k16 blocks that hold some k < K. Past K, TMA fills the tile with zeros,
// and the stock mainloop multiplies them all the same: the K-concatenation path's GEMMs (K = in +
// r, ops/grouped_ffn.h) spend a whole 64-wide k-tile on r = 16 columns, three quarters of it zeros
// (docs/plan_fused_lora.md step 0). Skipping a zero block leaves the f32 sums as they are, so the
// results do not change by a bit. Measured (session 18, shape A, ncu at the running clocks): the
// four K + r GEMMs within 0-12 us of session 17's, so their ~200 us over the frozen GEMMs is not
// the extra k-tile's MMAs.
//
// It derives from the stock collective and replaces mma() alone: the loads, the pipeline, the
// tensormaps and mma_tail are the stock ones, and the kernels pass the derived Params on to them
// by reference. The groups' common K travels in the mainloop's arguments (the forward forms' K is
// one for every group); k = 0 keeps every block.
#pragma once

#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>

namespace mt::ops::cuda::sm90 {

template <class Stock>
struct TailTrimmedMainloop : Stock {
  struct Arguments : Stock::Arguments {
    int k = 0;  // the groups' common K; 0: every k-tile runs whole
  };
  struct Params : Stock::Params {
    int k = 0;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args,
                                        void* workspace) {
    Params p{Stock::to_underlying_arguments(shapes, args, workspace)};
    p.k = args.k;
    return p;
  }

  // The stock consumer's protocol with K_PIPE_MMAS = 1 (one batch of wgmmas left in flight while
  // the stage before it is released; mma_tail waits for the last and releases its stage), the
  // k16 blocks of every tile unrolled so that the first block of the first tile overwrites the
  // accumulators and the last tile stops at K.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(typename Stock::MainloopPipeline pipeline,
                          typename Stock::PipelineState read, FrgTensorC& accum, int k_tiles,
                          int thread_idx, typename Stock::TensorStorage& storage,
                          Params const& params) {
    using namespace cute;
    using TiledMma = typename Stock::TiledMma;
    static_assert(Stock::K_PIPE_MMAS == 1, "written for one batch of wgmmas in flight");
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), typename Stock::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), typename Stock::SmemLayoutB{});
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(
        make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group));
    Tensor tA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA, M, K, PIPE)
    Tensor tB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA, N, K, PIPE)
    constexpr int kBlocks = size<2>(tA);
    constexpr int kTileK = size<2>(typename Stock::TileShape{});
    static_assert(kBlocks == 4, "the tail's cases below are written for four k16 blocks a tile");
    const int tail = params.k > 0 ? (params.k - 1) % kTileK / (kTileK / kBlocks) + 1 : kBlocks;

    // Tile t's batch: the first `n` k16 blocks of its stage, straight-line (blocks issued under a
    // run-time condition, or after a branch from their warpgroup_arrive, made ptxas fence the
    // accumulators between the wgmmas; the last tile's cases run once, after the loop).
    typename Stock::PipelineState release = read;
    auto consume = [&](auto n, int t) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int stage = read.index();
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < decltype(n)::value; ++b) {
        cute::gemm(tiled_mma, tA(_, _, b, stage), tB(_, _, b, stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      if (t > 0) {
        warpgroup_wait<1>();
        warpgroup_fence_operand(accum);
        pipeline.consumer_release(release);
        ++release;
      }
      ++read;
    };
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_NO_UNROLL
    for (int t = 0; t + 1 < k_tiles; ++t) consume(Int<kBlocks>{}, t);
    if (k_tiles > 0) {
      if (tail == 1)
        consume(Int<1>{}, k_tiles - 1);
      else if (tail == 2)
        consume(Int<2>{}, k_tiles - 1);
      else if (tail == 3)
        consume(Int<3>{}, k_tiles - 1);
      else
        consume(Int<kBlocks>{}, k_tiles - 1);
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace mt::ops::cuda::sm90
