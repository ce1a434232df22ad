// The K-concatenation forward's gate/up GEMM with X A^T formed in its own mainloop
// (docs/plan_fused_lora.md, plan step 1): gate_up_g = [X_g | xa_g] [W_g ; s B_g]^T where
// xa_g = X_g A_g^T is not read from X's padding but accumulated beside the base product from the X
// tiles the mainloop already holds (one m64n16k16 wgmma per warpgroup and k16 block), turned into
// bf16 (the rounding the skinny xa kernel applied when it stored xa) and multiplied into the
// accumulators by one register-A wgmma against the last k-tile's s B columns. Only the n-block-0
// tile of each row block forms xa: it stores it into X's padding (for the backward's dB_gu, as the
// xa pass did, and for the row block's other tiles), and their producers load it there with the
// adapter's k-tile once it is (wait_for_xa): their consumers read it from that stage's A tile.
//
// Cost (session 18, shape A, ncu at the running clocks). With every tile forming xa: 1,670-1,726 us
// against 1,520-1,549 for the K + r GEMM it replaces, beside which the xa pass took 177: even.
// Without the m64n16k16 wgmmas that kernel took 1,520 (their cost, ~150 us: each re-reads its
// 64 x 16 A block from shared memory, a quarter more than the base wgmma reads), without the
// slices' bulk copies 1,660. With n-block 0 alone forming xa: 1,622 against the frozen GEMM's
// 1,535 in the same run, ~135 us less than the K + r GEMM and the xa pass; that run also found
// the clusters' empty tiles miscounted (fixed since; run in session 19, call 1).
//
// What the stock mainloop lacks, and this one adds:
// - A third operand per stage, for the n-block-0 tiles: A_g's [16, 64] k-slice, which
//   lora_xa_side_pack_kernel wrote in the order TMA's 128-byte swizzle leaves a [16, 64] box in (so
//   one 2 KB bulk copy lands it), one block per k-tile and group (zeros past `in`: the last,
//   adapter k-tile's). The other tiles count its bytes as arrived (mbarrier.complete_tx).
// - The tile's coordinates for the consumers: mma() receives none, so the producer stores (m tile,
//   n-block, problem, its rows) beside each stage with st.async, which completes on the stage's
//   barrier like the TMA bytes.
// Both count in the stage's transaction bytes. The rank is 16 (one k16 block of the last tile, one
// register-A wgmma); the op takes this path only for ranks of 16 and `in` a multiple of 64, so the
// last k-tile holds the adapter's columns alone.
//
// The same mainloop serves the backward's dX GEMMs (kDb; plan steps 2-3): over [dY | dr] against
// [W ; A] (the input-gradient form, B N-major) the side product is dr = dY (s B) (the side slices
// are (s B)^T's), stored into dY's padding as xa is into X's. With kDb the kernel also adds dB +=
// s dY^T R (R = ha or xa, the forward's rank-r input, [rows, r]) from the dY tiles it holds: the
// k-tiles of a row block are shared out between its n-blocks past 0 (n-block b takes the (b - 1)-th
// of n_blocks - 1 contiguous ranges of whole pairs; a single n-block takes them all: n-block 0
// forms dr, and the others wait for it) and, within a range, alternately between the two
// warpgroups, each of which reads its stage's [rows, 64] tile transposed (the same bytes, MN-major)
// against R's tile in shared memory, into a 64 x r partial it adds to dB by f32 atomics while the
// stage's base wgmmas run (its own batch goes first, and the stage's wait retires it). Which stages
// a warpgroup takes is a compile-time pattern (pairs of stages, the first or the second), so that
// no wgmma is issued under a run-time condition.
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>

namespace mt::ops::cuda::sm90 {

template <class Stock, bool kDb = false>
struct LoraXaMainloop : Stock {
  using Bf16 = cutlass::bfloat16_t;
  static constexpr int kRank = 16;
  static constexpr int kStages = Stock::DispatchPolicy::Stages;
  static constexpr int kTileM = cute::size<0>(typename Stock::TileShape{});
  static constexpr int kTileN = cute::size<1>(typename Stock::TileShape{});
  static constexpr int kTileK = cute::size<2>(typename Stock::TileShape{});
  static constexpr int kSideElems = kRank * kTileK;  // one stage's A_g slice
  static constexpr uint32_t kSideBytes = kSideElems * sizeof(Bf16);
  static constexpr uint32_t kCoordBytes = 16;
  using SmemLayoutSide = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Bf16>{},
      cute::make_shape(cute::Int<kRank>{}, cute::Int<kTileK>{}, cute::Int<kStages>{})));
  static_assert(kTileK * sizeof(Bf16) == 128, "one 128-byte swizzled row per k-slice row");
  // The final product's B operand: the last k-tile of the stock's B, K-major (forward form) or
  // N-major (input-gradient form).
  static constexpr auto kMajorB =
      cute::is_same_v<typename Stock::InternalStrideB, cute::Stride<int64_t, cute::_1, cute::_0>>
          ? cute::GMMA::Major::K
          : cute::GMMA::Major::MN;
  // dB's operands: a stage's A tile read as (k, rows), MN-major (the bytes of the stock's K-major
  // (rows, k) layout), and R's tile, (j, rows) MN-major.
  using SmemLayoutAt = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<Bf16>{},
      cute::make_shape(cute::Int<kTileK>{}, cute::Int<kTileM>{}, cute::Int<kStages>{})));
  using SmemLayoutRk =
      decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW32_Atom<Bf16>{},
                                   cute::make_shape(cute::Int<kRank>{}, cute::Int<kTileM>{})));
  static_assert(cute::cosize_v<SmemLayoutAt> == cute::cosize_v<typename Stock::SmemLayoutA>,
                "the transposed view covers the stock's A stages");

  struct TensorStorage : Stock::TensorStorage {
    alignas(1024) cute::array_aligned<Bf16, cute::cosize_v<SmemLayoutSide>, 1024> smem_side;
    alignas(16) uint32_t coords[kStages][4];  // m tile, n tile, group, the group's rows
    alignas(128) cute::array_aligned<Bf16, kDb ? cute::cosize_v<SmemLayoutRk> : 8, 128> smem_rk;
  };

  struct Arguments : Stock::Arguments {
    const Bf16* const* side = nullptr;  // per group: its k-tiles' A_g slices (side_pack)
    int k = 0;                          // the groups' common K = in + r
    // Per row tile (group i's m tile t at tile0[i] + t): how many of the n-block-0 tile's consumer
    // warps stored their share of xa (zeroed before the launch).
    int* ready = nullptr;
    const int* tile0 = nullptr;
    // kDb: per group, R's rows (row pitch ldr) and its expert's dB [K - r, r] (f32, row pitch r);
    // dB's scale s; the n-blocks of a row block.
    const Bf16* const* rk = nullptr;
    int64_t ldr = 0;
    float* const* db = nullptr;
    float db_scale = 1.f;
    int n_blocks = 1;
  };
  struct Params : Stock::Params {
    const Bf16* const* side = nullptr;
    int k = 0;
    int* ready = nullptr;
    const int* tile0 = nullptr;
    const Bf16* const* rk = nullptr;
    int64_t ldr = 0;
    float* const* db = nullptr;
    float db_scale = 1.f;
    int n_blocks = 1;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args,
                                        void* workspace) {
    Params p{Stock::to_underlying_arguments(shapes, args, workspace)};
    p.side = args.side;
    p.k = args.k;
    p.ready = args.ready;
    p.tile0 = args.tile0;
    p.rk = args.rk;
    p.ldr = args.ldr;
    p.db = args.db;
    p.db_scale = args.db_scale;
    p.n_blocks = args.n_blocks;
    p.tma_transaction_bytes += kSideBytes + kCoordBytes;
    return p;
  }

  // The stock tensors plus the current group and its rows (tensors_perform_update is told the
  // group whenever it changes, before the first load of its tiles).
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& shape, Params const& params) const {
    auto t = Stock::load_init(shape, params);
    return cute::make_tuple(cute::get<0>(t), cute::get<1>(t), int32_t(0),
                            static_cast<int32_t>(cute::get<0>(shape)));
  }
  template <class Inputs, class ProblemShape_MNKL>
  CUTLASS_DEVICE auto tensors_perform_update(Inputs const& in, Params const&,
                                             ProblemShape_MNKL shape, int32_t group) {
    return cute::make_tuple(cute::get<0>(in), cute::get<1>(in), group,
                            static_cast<int32_t>(cute::get<0>(shape)));
  }

  // The stock producer's loads (A and B through TMA, multicast across the cluster as the stock
  // does), and per stage the A_g slice (n-block 0) and the coordinates.
  template <class Inputs, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Stock::MainloopPipeline pipeline,
                           typename Stock::PipelineState write, Inputs const& inputs,
                           TensorMaps const& tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_iter, int k_tiles, int, uint32_t block_rank_in_cluster,
                           TensorStorage& storage) {
    // One lane issues; the warp meets again before it returns. With the other lanes returning
    // early, the warp went on diverged into the kernel's next elect_one_sync, which lane 0 then met
    // at another one: an illegal instruction (session 20, call 10's cuda-gdb).
    if (cute::elect_one_sync())
      issue_loads(params, pipeline, write, inputs, tensormaps, blk_coord, k_iter, k_tiles,
                  block_rank_in_cluster, storage);
    __syncwarp();
  }

  template <class Inputs, class TensorMaps, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void issue_loads(Params const& params, typename Stock::MainloopPipeline pipeline,
                                  typename Stock::PipelineState write, Inputs const& inputs,
                                  TensorMaps const& tensormaps, BlockCoord const& blk_coord,
                                  KTileIterator k_iter, int k_tiles, uint32_t block_rank_in_cluster,
                                  TensorStorage& storage) {
    using namespace cute;
    using ClusterShape = typename Stock::DispatchPolicy::ClusterShape;
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), typename Stock::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), typename Stock::SmemLayoutB{});
    constexpr uint32_t kClusterX = size<0>(ClusterShape{});
    const uint2 block = {block_rank_in_cluster % kClusterX, block_rank_in_cluster / kClusterX};
    auto tma_a = params.tma_load_a.get_slice(block.y);
    auto tma_b = params.tma_load_b.get_slice(block.x);
    const auto m_coord = get<0>(blk_coord);
    const auto n_coord = get<1>(blk_coord);
    Tensor gA = get<0>(inputs)(_, _, m_coord, _, get<3>(blk_coord));
    Tensor gB = get<1>(inputs)(_, _, n_coord, _, get<3>(blk_coord));
    Tensor tAgA = tma_a.partition_S(gA);
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgB = tma_b.partition_S(gB);
    Tensor tBsB = tma_b.partition_D(sB);
    uint16_t mask_a = 0, mask_b = 0;
    auto cluster = Layout<ClusterShape>{};
    if constexpr (is_same_v<typename Stock::GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>)
      for (int n = 0; n < size<1>(cluster); ++n) mask_a |= uint16_t(1) << cluster(block.x, n, _0{});
    if constexpr (is_same_v<typename Stock::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>)
      for (int m = 0; m < size<0>(cluster); ++m) mask_b |= uint16_t(1) << cluster(m, block.y, _0{});
    const int32_t group = get<2>(inputs), rows = get<3>(inputs);
    const Bf16* side = params.side[group];
    const uint32_t rank = block_rank_in_cluster;
    // Past n-block 0 the adapter's k-tile of A holds xa once the row block's n-block-0 tile stored
    // it there.
    const int* ready = n_coord != 0 ? ready_count(params, group, m_coord) : nullptr;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tiles > 0; --k_tiles) {
      if (k_tiles == 1 && ready) wait_for_xa(ready);
      pipeline.producer_acquire(write);
      auto* barrier = pipeline.producer_get_barrier(write);
      const int stage = write.index();
      const int k = *k_iter;
      copy(params.tma_load_a.with(get<0>(tensormaps), *barrier, mask_a), tAgA(_, _, _, k),
           tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(get<1>(tensormaps), *barrier, mask_b), tBgB(_, _, _, k),
           tBsB(_, _, _, stage));
      // Only n-block 0 forms xa: the others' stages count the slice's bytes as arrived.
      if (ready == nullptr)
        SM90_BULK_COPY_G2S::copy(side + static_cast<int64_t>(k) * kSideElems,
                                 reinterpret_cast<uint64_t*>(barrier),
                                 storage.smem_side.data() + stage * kSideElems, kSideBytes);
      else
        asm volatile(
            "mbarrier.complete_tx.shared::cta.b64 [%0], %1;" ::"r"(cast_smem_ptr_to_uint(barrier)),
            "r"(kSideBytes)
            : "memory");
      const uint32_t at = set_block_rank(cast_smem_ptr_to_uint(&storage.coords[stage][0]), rank);
      const uint32_t bar = set_block_rank(cast_smem_ptr_to_uint(barrier), rank);
      asm volatile(
          "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
          "[%5];" ::"r"(at),
          "r"(static_cast<uint32_t>(m_coord)), "r"(static_cast<uint32_t>(n_coord)),
          "r"(static_cast<uint32_t>(group)), "r"(static_cast<uint32_t>(rows)), "r"(bar)
          : "memory");
      ++k_iter;
      ++write;
    }
  }

  // The consumer: k-tiles 0 .. k_tiles - 2 (X's columns) issue the base product's wgmmas and xa's
  // beside them; then xa is complete (one wait for every wgmma), rounded to bf16 and, as the
  // register A operand, multiplied into the accumulators against the last k-tile's first k16
  // block (the s B columns); the n-block-0 tile stores it into X's padding. The stages are released
  // as the stock mainloop releases them (one batch left in flight; mma_tail releases the last).
  // kDb: dB's wgmmas join the batches of the stages this warpgroup takes (see the file's comment).
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(typename Stock::MainloopPipeline pipeline,
                          typename Stock::PipelineState read, FrgTensorC& accum, int k_tiles,
                          int thread_idx, TensorStorage& storage, Params const& params) {
    using namespace cute;
    using TiledMma = typename Stock::TiledMma;
    static_assert(Stock::K_PIPE_MMAS == 1, "written for one batch of wgmmas in flight");
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    static_assert(kWarpGroups * 64 == kTileM, "each warpgroup owns 64 rows of the tile");
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    const auto wg_slice =
        make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{})(warp_group);
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), typename Stock::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), typename Stock::SmemLayoutB{});
    Tensor sS = make_tensor(make_smem_ptr(storage.smem_side.data()), SmemLayoutSide{});

    TiledMma tiled_mma;  // the base product: X W^T
    auto thr = tiled_mma.get_slice(wg_slice);
    Tensor tA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, M, K, PIPE)
    Tensor tB = thr.make_fragment_B(thr.partition_B(sB));  // (MMA, N, K, PIPE)
    constexpr int kBlocks = size<2>(tA);

    using SideMma =
        decltype(make_tiled_mma(SM90_64x16x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{},
                                Layout<Shape<Int<kWarpGroups>, _1, _1>>{}));
    SideMma side_mma;  // xa = X A^T
    auto side_thr = side_mma.get_slice(wg_slice);
    Tensor sdA = side_thr.make_fragment_A(side_thr.partition_A(sA));
    Tensor sdB = side_thr.make_fragment_B(side_thr.partition_B(sS));
    Tensor xa = partition_fragment_C(side_mma, Shape<Int<kTileM>, Int<kRank>>{});

    using RsAtom =
        decltype(GMMA::rs_op_selector<Bf16, Bf16, float, Shape<_64, Int<kTileN>, Int<kRank>>,
                                      GMMA::Major::K, kMajorB>());
    using RsMma = decltype(make_tiled_mma(RsAtom{}, Layout<Shape<Int<kWarpGroups>, _1, _1>>{}));
    RsMma rs_mma;  // accum += xa (sB)^T
    auto rs_thr = rs_mma.get_slice(wg_slice);
    Tensor rsB = rs_thr.make_fragment_B(rs_thr.partition_B(sB));
    Tensor xa16 = rs_thr.partition_fragment_A(
        make_tensor(make_smem_ptr(static_cast<Bf16*>(nullptr)),
                    make_layout(make_shape(Int<kTileM>{}, Int<kRank>{}), LayoutRight{})));
    static_assert(size(xa16) == size(xa), "xa's accumulator is the register A operand's layout");

    // dB's partial (64 k x r) of one stage, per warpgroup: A = the stage's tile transposed.
    DbMma db_mma;
    auto db_thr = db_mma.get_slice(thread_idx % cutlass::NumThreadsPerWarpGroup);
    Tensor sAt = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutAt{});
    Tensor sR = make_tensor(make_smem_ptr(storage.smem_rk.data()), SmemLayoutRk{});
    Tensor dbA = db_thr.make_fragment_A(db_thr.partition_A(sAt));  // (MMA, 1, rows / 16, PIPE)
    Tensor dbB = db_thr.make_fragment_B(db_thr.partition_B(sR));   // (MMA, 1, rows / 16)
    Tensor dbacc = partition_fragment_C(db_mma, Shape<Int<kTileK>, Int<kRank>>{});
    constexpr int kDbBlocks = size<2>(dbA);

    // The tile's coordinates ride with every stage: the first stage's say whether this tile forms
    // xa (n-block 0) or takes it from the one that did.
    pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
    const uint32_t* coords = storage.coords[read.index()];
    const uint32_t m_tile = coords[0], group = coords[2];
    const bool make_xa = coords[1] == 0;
    const int rows = static_cast<int>(coords[3]);

    // kDb: this n-block's k-tiles [t0, t1) of the k_tiles - 1 before the adapter's, and this
    // thread's share of R's tile, loaded now and stored into shared memory at t0.
    int t0 = 0, t1 = 0;
    uint4 rk_part = make_uint4(0, 0, 0, 0);
    if constexpr (kDb) {
      // Whole pairs of k-tiles (K - r even in k-tiles, sm90_lora_dr_fits): an odd range's last
      // stage would be a wgmma under a run-time condition, which serialised every wgmma.
      // With more than one n-block, n-block 0 (which forms dr, and which the others wait for)
      // takes none: n-block b > 0 takes the (b - 1)-th of n_blocks - 1 ranges.
      const int pairs = (k_tiles - 1) / 2, nb = static_cast<int>(coords[1]);
      const int sharers = max(params.n_blocks - 1, 1), share = params.n_blocks > 1 ? nb - 1 : 0;
      t0 = share < 0 ? 0 : 2 * (share * pairs / sharers);
      t1 = share < 0 ? 0 : 2 * ((share + 1) * pairs / sharers);
      // Branch-free (a row past the group's reads its last row, then zeros): the barriers of
      // store_rk want converged warps.
      const int row = static_cast<int>(m_tile) * kTileM + thread_idx / 2;
      rk_part = __ldg(reinterpret_cast<const uint4*>(
          params.rk[group] + static_cast<int64_t>(min(row, rows - 1)) * params.ldr +
          thread_idx % 2 * 8));
      if (row >= rows) rk_part = make_uint4(0, 0, 0, 0);
    }

    typename Stock::PipelineState release = read;
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    side_mma.accumulate_ = GMMA::ScaleOut::Zero;
    warpgroup_fence_operand(accum);
    warpgroup_fence_operand(xa);
    // One k-tile t: with db, dB's wgmmas first in a batch of their own; then the base product's
    // wgmmas and xa's beside them (with_xa); the wait that leaves the last batch in flight, the
    // previous stage's release and, with db, the partial's flush while the base product runs (its
    // registers live within the step: carried across steps they met at the loops' joins, where
    // the copies made ptxas serialise every wgmma). Straight-line batches: a wgmma under a
    // run-time condition made ptxas fence the accumulators.
    // (Forced inline: with kDb's four variants ptxas kept it a call, its accumulators in local
    // memory, every wgmma serialised.)
    auto step = [&](int t, auto with_xa, auto db) __attribute__((always_inline)) {
      constexpr bool kWithDb = decltype(db)::value;
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int stage = read.index();
      warpgroup_fence_operand(accum);
      warpgroup_fence_operand(xa);
      if constexpr (kWithDb) {
        warpgroup_fence_operand(dbacc);
        warpgroup_arrive();
        db_mma.accumulate_ = GMMA::ScaleOut::Zero;
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < kDbBlocks; ++b) {
          cute::gemm(db_mma, dbA(_, _, b, stage), dbB(_, _, b), dbacc);
          db_mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
      }
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < kBlocks; ++b) {
        cute::gemm(tiled_mma, tA(_, _, b, stage), tB(_, _, b, stage), accum);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        if constexpr (decltype(with_xa)::value) {
          cute::gemm(side_mma, sdA(_, _, b, stage), sdB(_, _, b, stage), xa);
          side_mma.accumulate_ = GMMA::ScaleOut::One;
        }
      }
      warpgroup_commit_batch();
      if (kWithDb || t > 0) {
        warpgroup_wait<1>();
        warpgroup_fence_operand(accum);
        warpgroup_fence_operand(xa);
      }
      if (t > 0) {
        pipeline.consumer_release(release);
        ++release;
      }
      if constexpr (kWithDb) {
        warpgroup_fence_operand(dbacc);
        flush_db(dbacc, t, group, thread_idx, params);
      }
      ++read;
    };
    // X's k-tiles, for warpgroup `role` (kDb: which of a pair of stages in [t0, t1) is its).
    auto x_tiles = [&](auto with_xa, auto role) __attribute__((always_inline)) {
      int t = 0;
      CUTLASS_PRAGMA_NO_UNROLL
      for (; t < t0; ++t) step(t, with_xa, cute::false_type{});
      if constexpr (kDb) {
        if (t1 > t0) store_rk(rk_part, sR, thread_idx);  // the same for every consumer
        constexpr bool first = decltype(role)::value == 0;
        CUTLASS_PRAGMA_NO_UNROLL
        for (; t + 1 < t1; t += 2) {
          step(t, with_xa, cute::bool_constant<first>{});
          step(t + 1, with_xa, cute::bool_constant<!first>{});
        }
      }
      CUTLASS_PRAGMA_NO_UNROLL
      for (; t + 1 < k_tiles; ++t) step(t, with_xa, cute::false_type{});
    };
    if constexpr (kDb) {
      if (warp_group == 0) {
        if (make_xa)
          x_tiles(cute::true_type{}, cute::Int<0>{});
        else
          x_tiles(cute::false_type{}, cute::Int<0>{});
      } else {
        if (make_xa)
          x_tiles(cute::true_type{}, cute::Int<1>{});
        else
          x_tiles(cute::false_type{}, cute::Int<1>{});
      }
    } else {
      if (make_xa)
        x_tiles(cute::true_type{}, cute::Int<0>{});
      else
        x_tiles(cute::false_type{}, cute::Int<0>{});
    }
    // The adapter's k-tile.
    pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
    const int stage = read.index();
    warpgroup_wait<0>();
    warpgroup_fence_operand(accum);
    warpgroup_fence_operand(xa);
    int* ready = ready_count(params, group, m_tile);
    if (make_xa) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(xa); ++i) xa16(i) = Bf16(xa(i));
      // Stored before the register-A wgmma reads xa16: its input registers may not be touched
      // until a wait covers it.
      store_xa(xa16, m_tile, group, rows, thread_idx, params);
    } else {  // the stage's A tile holds xa in its first r columns (wait_for_xa)
      Tensor coord = xa_coords(thread_idx);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(xa16); ++i) xa16(i) = sA(get<0>(coord(i)), get<1>(coord(i)), stage);
    }
    warpgroup_fence_operand(xa16);
    warpgroup_arrive();
    rs_mma.accumulate_ = GMMA::ScaleOut::One;
    cute::gemm(rs_mma, xa16(_, _, 0), rsB(_, _, 0, stage), accum);
    warpgroup_commit_batch();
    if (k_tiles > 1) {  // the stage before: its wgmmas completed at the wait above
      pipeline.consumer_release(release);
      ++release;
    }
    if (make_xa) {  // each warp's share is out: count it for the row block's other tiles
      __syncwarp();
      if (thread_idx % 32 == 0) {
        __threadfence();
        atomicAdd(ready, 1);
      }
    }
    ++read;
    warpgroup_fence_operand(accum);
  }

  // dB's partial: one warpgroup, m64 n16 k16 with both operands MN-major.
  using DbMma = decltype(cute::make_tiled_mma(
      cute::SM90_64x16x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>{}));
  // The consumers' barrier for R's tile: the first id past CUTLASS's reserved ones.
  static constexpr uint32_t kRkBarrier =
      static_cast<uint32_t>(cutlass::arch::ReservedNamedBarriers::FirstUserBarrier);
  // barrier.sync without .aligned (NamedBarrier's bar.sync is the aligned form, which synccheck
  // found entered by diverged warps here: session 20 call 3), after the warp reconverges.
  CUTLASS_DEVICE static void consumers_sync() {
    __syncwarp();
    asm volatile("barrier.sync %0, %1;" ::"r"(kRkBarrier), "r"(static_cast<uint32_t>(kConsumers))
                 : "memory");
  }

  // R's tile (this thread: row thread_idx / 2, columns 8 (thread_idx % 2) ..) into shared memory,
  // between two barriers of all consumers: the first waits for the last tile's dB wgmmas (both
  // warpgroups passed their adapter stage's wait), the second for every share (after the fence that
  // shows the generic proxy's stores to the wgmmas' async proxy).
  template <class SR>
  CUTLASS_DEVICE static void store_rk(uint4 part, SR& sR, int thread_idx) {
    static_assert(kConsumers == 2 * kTileM, "two threads per row of R's tile");
    consumers_sync();
    const int row = thread_idx / 2, j0 = thread_idx % 2 * 8;
    const Bf16* v = reinterpret_cast<const Bf16*>(&part);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 8; ++i) sR(j0 + i, row) = v[i];
    cutlass::arch::fence_view_async_shared();
    consumers_sync();
  }

  // dB[64 t + k][j] += s partial(k, j), two adjacent j per float2 atomic.
  template <class Frag>
  CUTLASS_DEVICE static void flush_db(Frag const& dbacc, int t, uint32_t group, int thread_idx,
                                      Params const& params) {
    using namespace cute;
    Tensor coord = DbMma{}
                       .get_slice(thread_idx % cutlass::NumThreadsPerWarpGroup)
                       .partition_C(make_identity_tensor(Shape<Int<kTileK>, Int<kRank>>{}));
    static_assert(size(decltype(coord){}) == size(Frag{}), "one coordinate per dB element");
    float* db = params.db[group] + static_cast<int64_t>(t) * kTileK * kRank;
    const float s = params.db_scale;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(coord); i += 2)
      atomicAdd(reinterpret_cast<float2*>(db + get<0>(coord(i)) * kRank + get<1>(coord(i))),
                make_float2(s * dbacc(i), s * dbacc(i + 1)));
  }

  // Element i of this thread's xa fragment: its (row, column) in the tile.
  CUTLASS_DEVICE static auto xa_coords(int thread_idx) {
    using namespace cute;
    using SideMma =
        decltype(make_tiled_mma(SM90_64x16x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{},
                                Layout<Shape<Int<kTileM / 64>, _1, _1>>{}));
    return SideMma{}
        .get_slice(thread_idx)
        .partition_C(make_identity_tensor(Shape<Int<kTileM>, Int<kRank>>{}));
  }

  // Row tile m of problem `group`'s count of the consumer warps that stored their xa.
  CUTLASS_DEVICE static int* ready_count(Params const& params, uint32_t group, uint32_t m) {
    return params.ready + params.tile0[group] + m;
  }

  // The consumer threads of a tile (`ready` counts their warps: kConsumers / 32 when xa is out).
  static constexpr int kConsumers = cute::size(typename Stock::TiledMma{});

  // xa into columns in .. in + 15 of the tile's X rows (the group's rows only); mma() then tells
  // the tiles of the other n-blocks that this warp's share is there (its lanes meet, then lane 0
  // fences and counts).
  template <class Frag>
  CUTLASS_DEVICE static void store_xa(Frag const& xa16, uint32_t m_tile, uint32_t group, int rows,
                                      int thread_idx, Params const& params) {
    using namespace cute;
    Tensor coord = xa_coords(thread_idx);
    static_assert(size(decltype(coord){}) == size(Frag{}), "one coordinate per xa element");
    auto* x =
        reinterpret_cast<Bf16*>(const_cast<typename Stock::InternalElementA*>(params.ptr_A[group]));
    const int64_t ld = get<0>(params.dA[group]);
    const int row0 = static_cast<int>(m_tile) * kTileM, col0 = params.k - kRank;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(coord); ++i) {
      const int row = row0 + get<0>(coord(i));
      if (row < rows) x[row * ld + col0 + get<1>(coord(i))] = xa16(i);
    }
  }

  // The producers of the tiles of n-blocks past 0 wait until the n-block-0 tile of their rows
  // stored xa (the persistent scheduler hands each CTA its tiles in rising order, in which,
  // rastered along M with no swizzle, a row tile's n-block 0 comes before its others, and an
  // n-block-0 tile's loads wait for nothing: the waits cannot close a cycle, provided every CTA of
  // the persistent grid, one per SM, is resident (resident_clusters sizes the grid so; beside
  // kernels holding SMs, or under an MPS or green-context SM limit, a CTA could still wait on one
  // not yet started, and the 10 s trap ends it), then load the adapter's
  // k-tile: TMA brings xa into the stage's A tile. The consumers read it there, where they used to
  // read it from global memory after the mainloop, a latency in every tile's tail (the fused GEMMs
  // with their side work switched off ran 9% over the stock GEMM at the same K: session 21 calls
  // 2-5). The acquire orders the other SMs' stores before this thread's reads; the proxy fence,
  // before TMA's (the async proxy). A wait past 10 s traps rather than hang.
  CUTLASS_DEVICE static void wait_for_xa(const int* ready) {
    const auto now_ns = [] {
      uint64_t t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      return t;
    };
    const uint64_t start = now_ns();
    for (;;) {
      int seen;
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(ready) : "memory");
      if (seen >= kConsumers / 32) break;
      if (now_ns() - start > 10'000'000'000ull) __trap();
      __nanosleep(64);
    }
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }
};

}  // namespace mt::ops::cuda::sm90
