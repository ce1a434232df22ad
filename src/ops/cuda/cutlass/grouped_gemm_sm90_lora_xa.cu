// The K-concatenation forward's gate/up GEMM with xa = X A^T in its mainloop (lora_xa_mainloop.cuh,
// grouped_gemm_sm90.h's sm90_lora_xa_*), and the backward's down dX GEMM with dr = dY (s B) and
// dB += s dY^T ha in its mainloop (sm90_lora_dr_*): the forward and input-gradient forms on the
// default configuration's tiles (128 x 256 x 64, two consumer warpgroups, cluster 2 x 1), and the
// kernel that lays the side operand out for them.
#include "ops/cuda/cutlass/grouped_gemm_sm90_impl.cuh"
#include "ops/cuda/cutlass/lora_xa_mainloop.cuh"
#include "ops/cuda/cutlass/swiglu_epilogue.cuh"

#include <cub/block/block_scan.cuh>

namespace mt::ops::cuda {

namespace sm90 {
namespace {

constexpr int kTileK = 64, kTileN = 256, kRank = 16;
constexpr int kSideBlock = kRank * kTileK;  // elements of one k-tile's A slice

using XaTile = cute::Shape<cute::_128, cute::Int<kTileN>, cute::Int<kTileK>>;
using XaCluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
// gate_up is written, never read (beta 0): an epilogue without a C source, whose shared memory (D's
// stages only) leaves the side slices room beside the stock kernel's four mainloop stages. With
// C's stages too (33 KB) three fitted, and a 128 x 16 sub-tile (17 KB) that kept four measured
// the fused GEMM 1,750 us at shape A against 1,549 + 177 for the K + r GEMM and the xa kernel.
using XaEpilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, XaTile, XaCluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, RowMajor*, 8, Bf16,
    RowMajor*, 8, CooperativeEpilogue,
    cutlass::epilogue::fusion::LinearCombination<Bf16, float, void, float>>::CollectiveOp;
// The stages' carve-out leaves room for the side slices and coordinates (kSideBlock bf16 + 16
// bytes a stage, for up to 4 stages, 1024-byte alignment included) and, with dB, R's tile.
template <class LayoutB, int kExtra>
using LoraStock = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, RowMajor*, 8, Bf16, LayoutB*, 8,
    float, XaTile, XaCluster,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(XaEpilogue::SharedStorage) + 4 * (kSideBlock * 2 + 16) + 1024 + kExtra)>,
    Cooperative>::CollectiveOp;
using XaGemm = Sm90Gemm<LoraXaMainloop<LoraStock<ColumnMajor, 0>>, XaEpilogue>;
// The interleaved gate/up layout's form (GroupedFfnParams::interleaved_gate_up): the epilogue also
// writes h = silu(g) u (swiglu_epilogue.cuh, UpInterleaved), in the same shared memory as
// XaEpilogue's (no C, D's stages).
using XaIlEpilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, XaTile, XaCluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, RowMajor*, 8, Bf16,
    RowMajor*, 8, CooperativeEpilogue, SwigluEvt<Sm90SwigluForm::UpInterleaved>>::CollectiveOp;
static_assert(sizeof(XaIlEpilogue::SharedStorage) == sizeof(XaEpilogue::SharedStorage),
              "the carve-out counted XaEpilogue's shared memory");
using XaIlGemm = Sm90Gemm<LoraXaMainloop<LoraStock<ColumnMajor, 0>>, XaIlEpilogue>;
// The input-gradient form (B = [W ; A] N-major) with dB: R's 128 x 16 tile (4 KB, 128-aligned).
using DrGemm =
    Sm90Gemm<LoraXaMainloop<LoraStock<RowMajor, kRank * 128 * 2 + 128>, true>, XaEpilogue>;
static_assert(sizeof(typename XaGemm::Kernel::SharedStorage) <= 227 * 1024,
              "the side slices fit beside the stages");
static_assert(sizeof(typename DrGemm::Kernel::SharedStorage) <= 227 * 1024,
              "the side slices and R's tile fit beside the stages");
static_assert(XaGemm::kStages == 4, "the stock configuration's four stages");
static_assert(XaIlGemm::kStages == 4, "the stock configuration's four stages");
static_assert(DrGemm::kStages == 4, "the stock configuration's four stages");
static_assert(XaGemm::kAKMajor && XaGemm::kBKMajor, "X W^T: both operands K-major");
static_assert(DrGemm::kAKMajor && !DrGemm::kBKMajor, "dY W: A K-major, B N-major");
using XaStrideD = typename XaGemm::Kernel::InternalStrideD;
static_assert(std::is_same_v<XaStrideD, typename DrGemm::Kernel::InternalStrideD>);

// The per-group arrays (D: gate_up's or dh's rows; no C; R and dB with DrGemm).
template <class G>
struct XaArrays {
  typename G::Shape* shape = nullptr;
  const Bf16** a = nullptr;
  const Bf16** b = nullptr;
  Bf16** d = nullptr;
  const Bf16** side = nullptr;
  int* tile0 = nullptr;  // group i's first row tile among all groups'
  int* ready = nullptr;  // per row tile (LoraXaMainloop::Arguments::ready)
  const Bf16** rk = nullptr;
  float** db = nullptr;
  Bf16** h = nullptr;  // XaIlGemm: h's rows
  typename G::StrideA* sa = nullptr;
  typename G::StrideB* sb = nullptr;
  XaStrideD* sd = nullptr;
  size_t bytes = 0;
};

// A row block's n-blocks (the tiles along N).
int64_t n_blocks(const Sm90Grouped& g) {
  return (g.n + kTileN - 1) / kTileN;
}

// The scheduler's swizzle for this kernel (xa_arguments), on which group_row_tiles depends.
constexpr int kSwizzle = 1;

// A group's row tiles as the scheduler hands them out: rounded up to whole clusters along M times
// the swizzle, 1 here (the
// last cluster's second tile may hold no rows, and still forms, stores and counts its empty xa;
// counted in the next group's first tile it let that tile's other n-blocks read xa before it was
// there: session 18 call 6).
__host__ __device__ inline int group_row_tiles(int rows) {
  constexpr int kBlock = cute::size<0>(XaCluster{}) * kSwizzle;
  return (rows + 128 * kBlock - 1) / (128 * kBlock) * kBlock;
}

// The row tiles of all groups.
int row_tiles(const GroupRows& rows, int count) {
  int tiles = 0;
  for (int i = 0; i < count; ++i) tiles += group_row_tiles(rows.rows[i]);
  return tiles;
}

template <class G>
XaArrays<G> xa_arrays(void* scratch, int count, int tiles) {
  auto* base = static_cast<char*>(scratch);
  XaArrays<G> r;
  size_t at = 0;
  r.shape = carve<typename G::Shape>(base, at, count);
  r.a = carve<const Bf16*>(base, at, count);
  r.b = carve<const Bf16*>(base, at, count);
  r.d = carve<Bf16*>(base, at, count);
  r.side = carve<const Bf16*>(base, at, count);
  r.tile0 = carve<int>(base, at, count);
  r.ready = carve<int>(base, at, tiles);
  r.rk = carve<const Bf16*>(base, at, count);
  r.db = carve<float*>(base, at, count);
  r.h = carve<Bf16*>(base, at, count);
  r.sa = carve<typename G::StrideA>(base, at, count);
  r.sb = carve<typename G::StrideB>(base, at, count);
  r.sd = carve<XaStrideD>(base, at, count);
  r.bytes = at;
  return r;
}

// The layout kernel's one block: a thread per group.
constexpr int kLayoutThreads = kMaxGroups;

// Group i's sizes, addresses and strides (A = X's or dY's rows, W_g at g.ldw and g.w_group,
// K-major or N-major as G reads it, D = gate_up's or dh's rows), its expert's side blocks and,
// for DrGemm, R's rows and its expert's dB.
template <class G>
__global__ void __launch_bounds__(kLayoutThreads)
    xa_layout_kernel(GroupRows t, int count, Sm90Grouped g, const Bf16* side, int64_t side_group,
                     Sm90LoraDb dbt, Bf16* h, int64_t ldh, XaArrays<G> out) {
  using cute::_1;
  // Group i's first row tile: a scan over the block (one block, kLayoutThreads >= count), where a
  // loop over the groups before it per thread took 5.7 us at 256 groups (session 21 call 6).
  using Scan = cub::BlockScan<int, kLayoutThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int i = threadIdx.x;
  int tile0 = 0;
  Scan(scan).ExclusiveSum(i < count ? group_row_tiles(t.rows[i]) : 0, tile0);
  if (i >= count) return;
  const int64_t row0 = t.row0[i], group = t.group[i];
  out.shape[i] = shape_of(g, t.rows[i]);
  out.a[i] = static_cast<const Bf16*>(g.a) + row0 * g.lda;
  out.b[i] = static_cast<const Bf16*>(g.b) + group * g.w_group;
  out.d[i] = static_cast<Bf16*>(g.c) + row0 * g.ldc;
  out.side[i] = side + group * side_group;
  out.tile0[i] = tile0;
  out.rk[i] = dbt.r ? static_cast<const Bf16*>(dbt.r) + row0 * dbt.ldr : nullptr;
  out.db[i] = dbt.db ? dbt.db + group * dbt.db_group : nullptr;
  out.h[i] = h ? h + row0 * ldh : nullptr;
  out.sa[i] = cute::make_stride(g.lda, _1{}, Zero{});
  if constexpr (G::kBKMajor)
    out.sb[i] = cute::make_stride(g.ldw, _1{}, Zero{});
  else
    out.sb[i] = cute::make_stride(_1{}, g.ldw, Zero{});
  out.sd[i] = cute::make_stride(g.ldc, _1{}, Zero{});
}

// side[e][t] = A_e's columns 64 t .. 64 t + 63 (zeros past `in`) in the order TMA's 128-byte
// swizzle leaves a [16, 64] bf16 box: row j at byte 128 j (1024 j / 8 past each 8-row atom), its
// 16-byte chunk c at chunk c ^ (j % 8). One thread per 16-byte chunk. `transposed`: A_e^T's rows
// (element (j, col) at col lda + j: the s B columns of the padded buffer).
__global__ void side_pack_kernel(const Bf16* a, int64_t lda, int64_t a_group, int64_t experts,
                                 int64_t in, int64_t tiles, bool transposed, Bf16* side) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= experts * tiles * kRank * (kTileK / 8)) return;
  const int c = static_cast<int>(i % (kTileK / 8)), j = static_cast<int>(i / (kTileK / 8) % kRank);
  const int64_t t = i / (kTileK / 8) / kRank % tiles, e = i / (kTileK / 8) / kRank / tiles;
  const int64_t col = t * kTileK + c * 8;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (col < in && !transposed) {
    v = *reinterpret_cast<const uint4*>(a + e * a_group + j * lda + col);
  } else if (col < in) {
    Bf16* w = reinterpret_cast<Bf16*>(&v);
    for (int q = 0; q < 8; ++q) w[q] = a[e * a_group + (col + q) * lda + j];
  }
  const int at = (j / 8) * 512 + (j % 8) * 64 + ((c ^ (j % 8)) * 8);
  *reinterpret_cast<uint4*>(side + (e * tiles + t) * kSideBlock + at) = v;
}

// The clusters of G's kernel the device holds at once (cudaOccupancyMaxActiveClusters), 0 when
// none fits or the query fails. The tiles past n-block 0 spin until their row block's n-block 0,
// in another CTA, has formed xa or dr: every CTA of the persistent grid must be resident at once,
// or resident spinning CTAs could hold the SMs that the producing CTA waits for. CUTLASS sizes
// the grid by this count when it is given and the clusters' CTAs fit the SM count (by an H100
// heuristic when not), at most the problems' tiles.
template <class G>
int resident_clusters(const Sm90Launch& at) {
  using K = typename G::Kernel;
  const void* fn = reinterpret_cast<const void*>(cutlass::device_kernel<K>);
  constexpr int smem = K::SharedStorageSize;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
    return 0;
  const dim3 cluster(cute::size<0>(typename K::ClusterShape{}),
                     cute::size<1>(typename K::ClusterShape{}), 1);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster.x;
  attr.val.clusterDim.y = cluster.y;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = cluster;
  cfg.blockDim = dim3(K::MaxThreadsPerBlock, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = at.stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  return cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg) == cudaSuccess ? clusters : 0;
}

template <class G>
typename G::Gemm::Arguments xa_arguments(const Sm90Grouped& g, int count, const Sm90Launch& at,
                                         const XaArrays<G>& arr, const Sm90LoraDb& dbt, int64_t ldh,
                                         const std::vector<typename G::Shape>& host, int clusters) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = at.device;
  hw.sm_count = at.multiprocessors;
  hw.max_active_clusters = clusters;
  typename G::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                   {count, arr.shape, host.data()},
                                   {arr.a, arr.sa, arr.b, arr.sb},
                                   {{}, nullptr, arr.sd, arr.d, arr.sd},
                                   hw};
  args.mainloop.side = arr.side;
  args.mainloop.k = static_cast<int>(g.k);
  args.mainloop.ready = arr.ready;
  args.mainloop.tile0 = arr.tile0;
  args.mainloop.rk = arr.rk;
  args.mainloop.ldr = dbt.ldr;
  args.mainloop.db = arr.db;
  args.mainloop.db_scale = dbt.scale;
  args.mainloop.n_blocks = static_cast<int>(n_blocks(g));
  if constexpr (std::is_same_v<G, XaIlGemm>) {  // h's rows for the SwiGLU node
    typename SwigluNode<Sm90SwigluForm::UpInterleaved>::Arguments node;
    node.h = arr.h;
    node.ldh = ldh;
    args.epilogue.thread = {{}, node};
  } else {
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = 0.f;
  }
  // Along M without swizzle, whatever the configuration: a row tile's n-block 0, which forms xa for
  // the others, comes first in each CTA's order (LoraXaMainloop::wait_for_xa).
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.max_swizzle_size = kSwizzle;
  args.scheduler.raster_order = Raster::AlongM;
  return args;
}

}  // namespace
}  // namespace sm90

namespace sm90 {
namespace {

template <class G>
size_t lora_scratch(const Sm90Grouped& g, const GroupRows& rows, int count, const Sm90Launch& at) {
  const XaArrays<G> arr = xa_arrays<G>(nullptr, count, row_tiles(rows, count));
  const auto host = host_shapes<G>(g, rows, count);
  // The workspace does not depend on the grid (the group scheduler asks for none; the collectives
  // size theirs by the SM count), so the launch alone queries the resident clusters.
  return arr.bytes +
         G::Gemm::get_workspace_size(xa_arguments(g, count, at, arr, Sm90LoraDb{}, 0, host, 0));
}

template <class G>
const char* lora_gemm(const Sm90Grouped& g, const void* side, int64_t side_group,
                      const Sm90LoraDb& dbt, void* h, int64_t ldh, const GroupRows& rows, int count,
                      const Sm90Launch& at, void* scratch) {
  const int clusters = resident_clusters<G>(at);
  if (clusters <= 0)
    return "cudaOccupancyMaxActiveClusters: no cluster of the fused kernel resident on the device "
           "(or the query failed)";
  const int tiles = row_tiles(rows, count);
  const XaArrays<G> arr = xa_arrays<G>(scratch, count, tiles);
  if (cudaMemsetAsync(arr.ready, 0, sizeof(int) * static_cast<size_t>(tiles), at.stream) !=
      cudaSuccess)
    return "clearing the row tiles' counts";
  xa_layout_kernel<G>
      <<<1, kLayoutThreads, 0, at.stream>>>(rows, count, g, static_cast<const Bf16*>(side),
                                            side_group, dbt, static_cast<Bf16*>(h), ldh, arr);
  if (cudaGetLastError() != cudaSuccess) return "the layout kernel's launch";
  const auto host = host_shapes<G>(g, rows, count);
  const auto args = xa_arguments(g, count, at, arr, dbt, ldh, host, clusters);
  return launch<G>(args, static_cast<char*>(scratch) + arr.bytes, at.stream);
}

}  // namespace
}  // namespace sm90

int64_t sm90_lora_xa_side_elems(int64_t experts, int64_t k) {
  return experts * ((k + sm90::kTileK - 1) / sm90::kTileK) * sm90::kSideBlock;
}

bool sm90_lora_xa_fits(const Sm90Grouped& g, int64_t in, int64_t rank, int count) {
  return g.form == Sm90Form::Forward && g.alpha == 1.f && g.beta == 0.f && rank == sm90::kRank &&
         in > 0 && in % sm90::kTileK == 0 && g.k == in + rank && sm90_grouped_fits(g, count);
}

bool sm90_lora_dr_fits(const Sm90Grouped& g, int64_t out, int64_t rank, int count) {
  return g.form == Sm90Form::InputGrad && g.alpha == 1.f && g.beta == 0.f && rank == sm90::kRank &&
         out > 0 && out % (2 * sm90::kTileK) == 0 && g.k == out + rank &&
         sm90_grouped_fits(g, count);
}

bool sm90_lora_dr_pays(const Sm90Grouped& g, const GroupRows& rows, int count) {
  // The tiles of n-blocks past 0 wait at their adapter stage for their row block's n-block 0,
  // which forms dr beside its base product. With few row tiles per group the scheduler (rastered
  // along M within a group) starts them beside that tile, and they stall for its side wgmmas:
  // shape B's gate/up dX (2 row tiles a group, 9 n-blocks) took 1,076 us against 930 + 106 for
  // the K + r GEMM and the out_grads pass (a loss), its down dX (4 n-blocks) 593 against the
  // frozen 475 + 117 for out_grads (even); shape A's (16 row tiles a group) 1,628 against 1,528 +
  // 187 and 889 against 767 + 188 (session 20 calls 12-13, ncu). With dr read by TMA (session 21
  // call 6) B's gate/up dX still took 1,110 against 972 + 108.
  int64_t tiles = 0;
  for (int i = 0; i < count; ++i) tiles += (rows.rows[i] + 127) / 128;
  return count > 0 && 2 * tiles >= sm90::n_blocks(g) * count;
}

const char* sm90_lora_xa_side_pack(const void* a, int64_t lda, int64_t a_group, int64_t experts,
                                   int64_t in, int64_t k, bool transposed, void* side,
                                   cudaStream_t stream) {
  using namespace sm90;
  const int64_t tiles = (k + kTileK - 1) / kTileK, n = experts * tiles * kRank * (kTileK / 8);
  if (n == 0) return nullptr;
  side_pack_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      static_cast<const Bf16*>(a), lda, a_group, experts, in, tiles, transposed,
      static_cast<Bf16*>(side));
  return cudaGetLastError() == cudaSuccess ? nullptr : "the side pack kernel's launch";
}

size_t sm90_lora_xa_scratch(const Sm90Grouped& g, const GroupRows& rows, int count,
                            const Sm90Launch& at, bool with_h) {
  return with_h ? sm90::lora_scratch<sm90::XaIlGemm>(g, rows, count, at)
                : sm90::lora_scratch<sm90::XaGemm>(g, rows, count, at);
}

const char* sm90_lora_xa_gemm(const Sm90Grouped& g, const void* side, int64_t side_group,
                              const GroupRows& rows, int count, const Sm90Launch& at, void* scratch,
                              void* h, int64_t ldh) {
  if (h)
    return sm90::lora_gemm<sm90::XaIlGemm>(g, side, side_group, Sm90LoraDb{}, h, ldh, rows, count,
                                           at, scratch);
  return sm90::lora_gemm<sm90::XaGemm>(g, side, side_group, Sm90LoraDb{}, nullptr, 0, rows, count,
                                       at, scratch);
}

size_t sm90_lora_dr_scratch(const Sm90Grouped& g, const GroupRows& rows, int count,
                            const Sm90Launch& at) {
  return sm90::lora_scratch<sm90::DrGemm>(g, rows, count, at);
}

const char* sm90_lora_dr_gemm(const Sm90Grouped& g, const void* side, int64_t side_group,
                              const Sm90LoraDb& db, const GroupRows& rows, int count,
                              const Sm90Launch& at, void* scratch) {
  return sm90::lora_gemm<sm90::DrGemm>(g, side, side_group, db, nullptr, 0, rows, count, at,
                                       scratch);
}

}  // namespace mt::ops::cuda
