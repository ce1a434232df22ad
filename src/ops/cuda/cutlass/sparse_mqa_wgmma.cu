// The absorbed sparse MQA forward on wgmma (sparse_mqa_wgmma.h). mma.sync needs 16 rows and
// wgmma 64 a warpgroup; a query has 32 heads, so the KEYS are the rows:
//   S^T [64 keys x 32 heads] = K [64 x 576] q^T        (m64n32k16 x 36, A = the gathered key
//                                                        tile, K-major; B = q, K-major)
//   O^T [512 x 32 heads]    += V^T [512 x 64] P^T       (m64n32k16, 8 M tiles x 4 k steps; A =
//                                                        the same key tile read transposed, MN-
//                                                        major; B = P^T through shared memory)
// V^T as an MN-major A needs no copy: the K-major 128-byte-swizzled key tile read with its modes
// swapped is the MN-major swizzled layout (CuTe composes the view, the descriptors follow).
// P cannot be a register A operand (O's rows are value dims, not keys), so the tile's P (bf16)
// goes to shared memory as a K-major B [32 heads x 64 keys]: 4 KiB.
// One warpgroup per block. Buffers = 2: one block per SM (185 KiB: q 36 KiB, two 72 KiB key
// tiles, P), the next tile in flight (cp.async) while this one is multiplied; Buffers = 1: one key
// tile, two blocks per SM, each gathering while the other multiplies. Estimated bound: the
// gather (1,152 bytes from L2 per listed key, once for all heads). Online softmax per head (a
// column of S^T: the max over the 64 keys meets across the four warps in shared memory), in log2
// units, lse saved in natural log as the mma.sync kernels save it (the backward reads it).
#include "ops/cuda/cutlass/sparse_mqa_wgmma.h"

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <utility>

namespace mt::ops::cuda {

namespace {

using namespace cute;
using bf16 = cutlass::bfloat16_t;

constexpr int kDk = 576, kDv = 512, kKeys = 64, kHeads = kMqaWgmmaHeads, kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunks = kDk / 8;  // 16-byte chunks of an entry
constexpr int kLdo = kDv + 8;     // the output's staging rows (bf16), conflict-free stores
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kHeads == 32 && kKeys == 64, "the accumulator arithmetic below is m64n32's");

// 128-byte swizzled K-major atoms (8 rows x 64 bf16, 1 KiB), the layout wgmma reads fastest.
using AtomK = GMMA::Layout_K_SW128_Atom<bf16>;
using LayoutKeys = decltype(tile_to_shape(AtomK{}, Shape<Int<kKeys>, Int<kDk>>{}));  // (key, dim)
using LayoutQ = decltype(tile_to_shape(AtomK{}, Shape<Int<kHeads>, Int<kDk>>{}));    // (head, dim)
using LayoutP = decltype(tile_to_shape(AtomK{}, Shape<Int<kHeads>, Int<kKeys>>{}));  // (head, key)
// (dim, key) over the first 512 dims of a key tile: V^T, the second product's MN-major A.
using LayoutVt =
    decltype(composition(LayoutKeys{}, make_layout(Shape<Int<kDv>, Int<kKeys>>{}, GenRowMajor{})));

using MmaS =
    decltype(make_tiled_mma(SM90_64x32x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}));
using MmaO =
    decltype(make_tiled_mma(SM90_64x32x16_F32BF16BF16_SS<GMMA::Major::MN, GMMA::Major::K>{}));

constexpr int kQElems = kHeads * kDk, kKeyElems = kKeys * kDk, kPElems = kHeads * kKeys;
// Shared memory of a block with `Buffers` key tiles: two (185 KiB, one block per SM: tile i + 1
// lands while tile i is multiplied) or one (113 KiB: two blocks per SM, each gathering while the
// other multiplies; 2 x (113 + 1 reserved) KiB is exactly an SM's 228).
template <int Buffers>
constexpr size_t smem_bytes() {
  return sizeof(bf16) * (kQElems + Buffers * kKeyElems + kPElems) +
         sizeof(float) * kWarps * kHeads + sizeof(int) * 2 * kKeys;
}
static_assert(2 * (smem_bytes<1>() + 1024) <= 233472, "two one-buffer blocks share an SM");
static_assert(smem_bytes<2>() <= 232448, "a two-buffer block fits");
static_assert(sizeof(bf16) * kQElems % 1024 == 0 && sizeof(bf16) * kKeyElems % 1024 == 0,
              "every swizzled tile starts on 1 KiB (the 128-byte swizzle's period)");
static_assert(kHeads * kLdo <= kKeyElems, "the output's staging fits a key tile");

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Element (r, c) of a swizzled tile at `base`. Through a tensor: the swizzle acts on the smem
// pointer's bits (CuTe's smem_ptr_flag), which calling the composed layout on (r, c) would not do.
template <class Layout>
__device__ __forceinline__ bf16* at(bf16* base, int r, int c) {
  return &make_tensor(make_smem_ptr(base), Layout{})(r, c);
}

__device__ __forceinline__ bool valid_slot(int32_t s, int64_t T) {
  return s >= 0 && static_cast<int64_t>(s) < T;
}

// The gather: 8 threads per slot, each copying 16-byte chunks c0, c0 + 8, ... of it, so that a
// warp's cp.async covers four 128-byte lines (two threads per slot covered 16 lines per
// instruction, 16 wavefronts); a block of NT threads (the forward's 128, the backward's 256) takes
// slots r0 = tid / 8 + (NT / 8) p, p < passes<NT>.
constexpr int kPerSlot = 8;
template <int NT>
constexpr int kPassesOf = kKeys / (NT / kPerSlot);
constexpr int kPasses = kPassesOf<kThreads>;
static_assert(kChunks % kPerSlot == 0 && kKeys % (kThreads / kPerSlot) == 0, "whole passes");

// This thread's slot indices of a tile (loaded a tile ahead, so that the index's global latency
// does not stall the warps right after the barrier that publishes a tile).
template <int NT>
__device__ __forceinline__ void slots_of(int32_t (&s)[kPassesOf<NT>], const int32_t* row,
                                         int64_t tile, int64_t K) {
#pragma unroll
  for (int p = 0; p < kPassesOf<NT>; ++p) {
    const int64_t j = tile * kKeys + threadIdx.x / kPerSlot + (NT / kPerSlot) * p;
    s[p] = j < K ? row[j] : -1;
  }
}

// cp.async of 16 bytes that reads `bytes` (16, or 0: the destination is zero-filled).
__device__ __forceinline__ void cp_async16_fill(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}

// Byte offset of the thread's first chunk in a swizzled key tile: chunk c0 + 8 k of its pass-p
// row r = tid / 8 + (NT / 8) p lies at this + 16 NT p + 8192 k. LayoutKeys tiles its 1 KiB atoms
// (8 rows x 128 bytes) keys first: row r's atom is r / 8 + 8 (dims / 64), so a row's chunks
// c0 + 8 k are one atom column (8,192 bytes) apart and pass p adds NT / 64 atoms; inside an atom
// the 128-byte swizzle puts chunk c of row r at (c ^ r % 8). Checked against CuTe's tensor
// addresses for every (row, chunk) on the host when written (NT = 128).
__device__ __forceinline__ uint32_t gather_offset() {
  const int c0 = threadIdx.x % kPerSlot, q = (threadIdx.x / kPerSlot) % 8;
  return static_cast<uint32_t>((threadIdx.x / 64) * 1024 + q * 128 + (c0 ^ q) * 16);
}

// The listed entries into the swizzled tile at shared address `tile` (zeros for an unused slot:
// its P is 0, and 0 x stale shared memory could be NaN), their positions into slot[] (-1 when
// unused). Addresses are the thread's offset plus constants: ~2 instructions a chunk, where the
// tensor's swizzle arithmetic took ~20 (the kernel issues one warp per scheduler, so every
// instruction's latency shows).
template <int NT>
__device__ __forceinline__ void gather(uint32_t tile, int* slot, const bf16* kv, int64_t T,
                                       const int32_t (&s)[kPassesOf<NT>]) {
  static_assert(NT % 64 == 0 && kChunks / kPerSlot == 9 && kKeys == 64, "gather_offset's tiling");
  const int c0 = threadIdx.x % kPerSlot;
  const uint32_t d0 = tile + gather_offset();
#pragma unroll
  for (int p = 0; p < kPassesOf<NT>; ++p) {
    const int r = threadIdx.x / kPerSlot + (NT / kPerSlot) * p;
    const bool ok = valid_slot(s[p], T);
    const bf16* src = kv + (ok ? static_cast<int64_t>(s[p]) * kDk + 8 * c0 : 0);
    const uint32_t bytes = ok ? 16u : 0u;
#pragma unroll
    for (int k = 0; k < kChunks / kPerSlot; ++k)  // within row 0 if unused
      cp_async16_fill(d0 + 16u * NT * p + 8192u * k, src + 64 * k, bytes);
    if (c0 == 0) slot[r] = ok ? s[p] : -1;
  }
}

// The m64n32 accumulator (PTX's wgmma D fragment, CuTe's CLayout_64x32, value order equal): value
// v of lane `lane` in warp w sits at row 16 w + lane / 4 + 8 ((v >> 1) & 1) of its 64-row tile and
// column 8 (v >> 2) + 2 (lane & 3) + (v & 1). A thread holds 8 columns (heads), j = 0 .. 7.
__device__ __forceinline__ int col_slot(int v) {
  return 2 * (v >> 2) + (v & 1);
}
__device__ __forceinline__ int col_of(int j, int lane) {
  return 8 * (j >> 1) + 2 * (lane & 3) + (j & 1);
}
__device__ __forceinline__ int row_of(int v, int w, int lane) {
  return 16 * w + (lane >> 2) + 8 * ((v >> 1) & 1);
}

// Shared byte address of the thread's P value v (head col_of, key row_of) in LayoutP's swizzled
// [32 heads x 64 keys] tile at `ps`: atom v >> 2 (8 heads), row hq = head % 8, chunk (key / 8) ^
// hq, key % 8 = lane / 4 inside it. pb[] holds the four (v & 1, (v >> 1) & 1) cases; v >> 2 adds 1
// KiB. Checked on the host, when written, against CuTe's partition_C of LayoutP viewed as (key,
// head) (composition with a (64, 32) row-major layout) for every thread and value.
__device__ __forceinline__ void p_addresses(uint32_t (&pb)[4], uint32_t ps, int w, int lane) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int hq = 2 * (lane & 3) + (e & 1), kb = 2 * w + (e >> 1);
    pb[e] = ps + static_cast<uint32_t>(hq * 128 + (kb ^ hq) * 16 + (lane >> 2) * 2);
  }
}

__device__ __forceinline__ void st_shared_b16(uint32_t addr, bf16 x) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(x.raw()) : "memory");
}

// A query's kHeads rows of Dim bf16 columns (row stride Dim, from src) into shared memory in
// Layout, 16 bytes a cp.async over NT threads; rows from `valid` on (heads past H) zeroed.
template <class Layout, int Dim, int NT>
__device__ __forceinline__ void stage_head_rows(bf16* smem, const bf16* src, int valid, int tid) {
  constexpr int kPerRow = Dim / 8;
  for (int i = tid; i < kHeads * kPerRow; i += NT) {
    const int r = i / kPerRow, c8 = (i % kPerRow) * 8;
    bf16* d = at<Layout>(smem, r, c8);
    if (r < valid)
      cp_async16(d, src + static_cast<int64_t>(r) * Dim + c8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
}

// acc = A B over the fragments' k blocks (B's count), waited out: one warpgroup's chain of
// wgmmas. The forward's S^T and the backward's S^T run this same chain, so that the backward's P
// matches the forward's lse bit for bit.
template <class Mma, class FragA, class FragB, class Acc>
__device__ __forceinline__ void wgmma_product(Mma& mma, const FragA& a, const FragB& b, Acc& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int k = 0; k < size<2>(b); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
}

template <int Buffers>
__global__ void __launch_bounds__(kThreads, 3 - Buffers) mqa_fwd_wgmma_kernel(MqaWgmmaArgs a) {
  static_assert(Buffers == 1 || Buffers == 2, "one or two key tiles");
  extern __shared__ __align__(1024) unsigned char smem[];
  // The swizzle's address bits are the shared window's: the tiles must start on 1 KiB.
  if (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) % 1024 != 0) __trap();
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* const K0 = Qs + kQElems;  // key tiles [Buffers][kKeyElems]: tile it's at it % Buffers
  bf16* Ps = K0 + Buffers * kKeyElems;
  float* red = reinterpret_cast<float*>(Ps + kPElems);         // [kWarps][kHeads]
  int* slots = reinterpret_cast<int*>(red + kWarps * kHeads);  // [2][kKeys]

  // Later queries first: a causal selection's later queries list the most keys, so the blocks
  // that start last are the shortest (as the Split kernels).
  const int64_t t = a.T - 1 - static_cast<int64_t>(blockIdx.x);
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kHeads;
  const int valid = static_cast<int>(min(static_cast<int64_t>(kHeads), a.H - h0));
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int32_t* row = a.idx + t * a.K;
  const bf16* kv = static_cast<const bf16*>(a.kv);
  const float scale_log2 = a.scale * kLog2e;

  // the block's q rows, swizzled; heads past H zero
  stage_head_rows<LayoutQ, kDk, kThreads>(Qs, static_cast<const bf16*>(a.q) + (t * a.H + h0) * kDk,
                                          valid, tid);
  const int tiles = static_cast<int>((a.K + kKeys - 1) / kKeys);
  int32_t next[kPasses];  // this thread's slot indices of tile it + 1
  slots_of<kThreads>(next, row, 0, a.K);
  const uint32_t K0s = static_cast<uint32_t>(__cvta_generic_to_shared(K0));
  if (tiles > 0) gather<kThreads>(K0s, slots, kv, a.T, next);
  cp_async_commit();
  slots_of<kThreads>(next, row, 1, a.K);

  MmaS mma_s;
  MmaO mma_o;
  auto ts = mma_s.get_thread_slice(tid);
  auto to = mma_o.get_thread_slice(tid);
  Tensor tSrQ = ts.partition_fragment_B(make_tensor(make_smem_ptr(Qs), LayoutQ{}));  // (,1,36)
  Tensor tOrP = to.partition_fragment_B(make_tensor(make_smem_ptr(Ps), LayoutP{}));  // (,1,4)
  uint32_t pb[4];  // P's stores into LayoutP (p_addresses)
  p_addresses(pb, static_cast<uint32_t>(__cvta_generic_to_shared(Ps)), w, lane);
  Tensor accO = partition_fragment_C(mma_o, Shape<Int<kDv>, Int<kHeads>>{});    // (16,8,1)
  Tensor accS = partition_fragment_C(mma_s, Shape<Int<kKeys>, Int<kHeads>>{});  // (16,1,1)
  static_assert(size(decltype(accS){}) == 16 && size(decltype(accO){}) == 128, "m64n32");
  clear(accO);
  float m[8], l[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
  }

  for (int it = 0; it < tiles; ++it) {
    bf16* const Kt = K0 + (it % Buffers) * kKeyElems;
    // Tile it + 1's gather (the slot lists alternate in either case: a skipped tile's warps may
    // still read this tile's list while it is issued).
    auto issue_next = [&] {
      if (it + 1 < tiles)
        gather<kThreads>(K0s + ((it + 1) % Buffers) * (kKeyElems * 2),
                         slots + ((it + 1) & 1) * kKeys, kv, a.T, next);
      cp_async_commit();
      slots_of<kThreads>(next, row, it + 2, a.K);
    };
    cp_async_wait_all();
    cutlass::arch::fence_view_async_shared();  // cp.async's and the zero stores for wgmma
    __syncthreads();  // tile it landed; every warp is done with tile it - 1 (buffer, P, red)
    if constexpr (Buffers == 2) issue_next();
    const int* sl = slots + (it & 1) * kKeys;
    if (!__any_sync(0xffffffffu, sl[lane] >= 0 || sl[lane + 32] >= 0)) {  // block-uniform
      if constexpr (Buffers == 1) issue_next();  // nobody reads this tile's keys
      continue;
    }

    Tensor sK = make_tensor(make_smem_ptr(Kt), LayoutKeys{});
    Tensor tSrK = ts.partition_fragment_A(sK);  // (,1,36)
    wgmma_product(mma_s, tSrK, tSrQ, accS);

    // Column (head) maxima over the tile's 64 keys: the thread's two rows, the 8 lanes of equal
    // lane & 3, then the four warps through shared memory.
    float s[16], mx[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) mx[j] = -INFINITY;
#pragma unroll
    for (int v = 0; v < 16; ++v) {
      const bool ok = sl[row_of(v, w, lane)] >= 0;
      s[v] = ok ? accS(v) * scale_log2 : -INFINITY;
      mx[col_slot(v)] = fmaxf(mx[col_slot(v)], s[v]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int x = 4; x < 32; x <<= 1) mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], x));
      if (lane < 4) red[w * kHeads + col_of(j, lane)] = mx[j];
    }
    __syncthreads();
    // The max a head's P is taken against moves only when the tile's max passes it by more than
    // kStale (log2 units): until then p <= 2^kStale (exact enough in bf16 and fp32: the relative
    // precision is the same), O and l scale alike, and the lse uses the max actually used. O's
    // 128 rescaling multiplies then run only in the tiles (mostly the first few) that move one.
    constexpr float kStale = 8.f;
    float al[8], mu[8];
    bool moved = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float* rr = red + col_of(j, lane);
      const float mn =
          fmaxf(fmaxf(m[j], fmaxf(rr[0], rr[kHeads])), fmaxf(rr[2 * kHeads], rr[3 * kHeads]));
      const float mk = mn > m[j] + kStale ? mn : m[j];  // m = -inf: any finite mn moves it
      mu[j] = mk == -INFINITY ? 0.f : mk;
      al[j] = exp2f(m[j] - mu[j]);  // 1 exactly where the max stays
      moved |= mk != m[j];
      m[j] = mk;
      l[j] *= al[j];
    }
#pragma unroll
    for (int v = 0; v < 16; ++v) {
      const float p = exp2f(s[v] - mu[col_slot(v)]);
      l[col_slot(v)] += p;
      st_shared_b16(pb[(v & 1) + 2 * ((v >> 1) & 1)] + 1024u * (v >> 2), bf16(p));
    }
    if (__any_sync(0xffffffffu, moved)) {  // warp-uniform
#pragma unroll
      for (int mt = 0; mt < size<1>(accO); ++mt)
#pragma unroll
        for (int v = 0; v < 16; ++v) accO(v, mt, 0) *= al[col_slot(v)];
    }
    cutlass::arch::fence_view_async_shared();  // P's stores for wgmma
    __syncthreads();                           // all of P

    Tensor tOrV = to.partition_fragment_A(make_tensor(make_smem_ptr(Kt), LayoutVt{}));  // (,8,4)
    warpgroup_fence_operand(accO);
    warpgroup_arrive();
#pragma unroll
    for (int k = 0; k < size<2>(tOrV); ++k) cute::gemm(mma_o, tOrV(_, _, k), tOrP(_, _, k), accO);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(accO);
    if constexpr (Buffers == 1) {
      __syncthreads();  // each warp's MMAs read its own 16 key rows: all are done with the tile
      issue_next();
    }
  }
  cp_async_wait_all();
  __syncthreads();  // every warp is done with the tiles and red

  // Row sums: the thread's partial sums over its rows, the lanes, then the warps.
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) l[j] += __shfl_xor_sync(0xffffffffu, l[j], x);
    if (lane < 4) red[w * kHeads + col_of(j, lane)] = l[j];
  }
  __syncthreads();
  float inv[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int h = col_of(j, lane);
    const float* rr = red + h;
    const float L = (rr[0] + rr[kHeads]) + (rr[2 * kHeads] + rr[3 * kHeads]);
    inv[j] = L > 0.f ? 1.f / L : 0.f;  // no valid slot: o = 0, lse = -inf
    if (w == 0 && lane < 4 && h < valid)
      a.lse[t * a.H + h0 + h] = L > 0.f ? (m[j] + log2f(L)) * kLn2 : -INFINITY;
  }
  // O^T's accumulators into a [head][kLdo] staging tile (key buffer 0), then 16-byte row stores.
  bf16* Os = K0;
#pragma unroll
  for (int mt = 0; mt < size<1>(accO); ++mt)
#pragma unroll
    for (int v = 0; v < 16; ++v)
      Os[col_of(col_slot(v), lane) * kLdo + 64 * mt + row_of(v, w, lane)] =
          bf16(accO(v, mt, 0) * inv[col_slot(v)]);
  __syncthreads();
  bf16* o = static_cast<bf16*>(a.o) + (t * a.H + h0) * kDv;
  for (int i = tid; i < valid * (kDv / 8); i += kThreads) {
    const int r = i / (kDv / 8), c8 = (i % (kDv / 8)) * 8;
    *reinterpret_cast<uint4*>(o + static_cast<int64_t>(r) * kDv + c8) =
        *reinterpret_cast<const uint4*>(Os + r * kLdo + c8);
  }
}

// ---------------------------------------------------------------------------------------------
// The backward (sparse_mqa_bwd_wgmma), per (query, 32 heads) and 64-key tile, the keys as rows
// again, two warpgroups (WG0, WG1) over one gathered key tile:
//   S^T  [64 x 32]  = K q^T           WG0, m64n32k16 x 36 (the forward's MMAs: the same S bit
//                                     for bit, so P = exp2(S scale - lse) is the forward's)
//   dP^T [64 x 32]  = V dout^T        WG1, x 32 (A the key tile's first 512 dims, B dout)
//   P^T (WG0, fp32 to WG1 through shared memory), dS^T = scale P^T (dP^T - Delta) (WG1), both
//   staged bf16 in LayoutP ([32 heads x 64 keys], K-major: the forward's P tile)
//   dq^T [576 x 32] += K^T dS^T       9 M tiles x 4 k steps: WG0 tiles 0-4, WG1 5-8 (A the key
//                                     tile read transposed, B dS), accumulated over all tiles
//   dkv  [64 x 576] = dS^T q + P^T dout (first 512 dims), in chunks of 64 columns: WG0 chunks
//                                     0-3, WG1 4-8 (m64n64k16, A P / dS read transposed from
//                                     their tiles, B q / dout read transposed: all MN-major views
//                                     of the K-major tiles, no copies); each chunk's accumulators
//                                     go out as float4 reds into the f32 [T, 576] sum while the
//                                     next chunk's MMAs run.
// Per tile 36 + 32 + 36 + 68 m64n32k16 equivalents, about even between the warpgroups (88 / 84).
// The key gradient's reds are the mma.sync kernels' (one per key and 4 columns, heads summed on
// the tensor cores): atomics, not a per-key gather through a transposed table, because a key's
// gradient needs every listing query's q and dout rows and P (recomputed per pair) where here
// each product is formed once next to its operands; dkv rows of different queries collide only
// through the lists, so no block-local reduction applies beyond the head sum. Not bit-repeatable
// (the reds' order varies): a deterministic context runs the composite.
// One key buffer (shared memory 157 KiB: q 36, dout 32, keys 72, P, dS 4 each, P in fp32 8):
// the next tile is gathered once dq's MMAs are done with this one, under the key-gradient
// products and their reds.
// Grad = false: the KL target alone (sparse_mqa_prob_sum of this generation): WG0's S and P and
// the head sum, so that the target of the separate pass and the backward's agree bit for bit.
constexpr int kBwdThreads = 256;
constexpr int kDqTiles = kDk / 64;                   // 9 M tiles of dq^T
constexpr int kDqTiles0 = 5;                         // WG0's; WG1 takes the other 4
constexpr int kKvChunks = kDk / 64, kKvChunks0 = 4;  // key-gradient column chunks; WG0's
constexpr int kVChunks = kDv / 64;                   // chunks with value columns (+ P^T dout)
constexpr int kLdq = kDk + 8;                        // dq's staging rows (bf16)
constexpr int kDoElems = kHeads * kDv;

using LayoutDO = decltype(tile_to_shape(AtomK{}, Shape<Int<kHeads>, Int<kDv>>{}));  // (head, dim)
// (dim, key) over all 576 dims: K^T, dq's MN-major A.
using LayoutKt =
    decltype(composition(LayoutKeys{}, make_layout(Shape<Int<kDk>, Int<kKeys>>{}, GenRowMajor{})));
// (key, head) of the P / dS tiles: the key gradient's MN-major A.
using LayoutPt =
    decltype(composition(LayoutP{}, make_layout(Shape<Int<kKeys>, Int<kHeads>>{}, GenRowMajor{})));
// (dim, head) of q and dout: the key gradient's MN-major B.
using LayoutQt =
    decltype(composition(LayoutQ{}, make_layout(Shape<Int<kDk>, Int<kHeads>>{}, GenRowMajor{})));
using LayoutDOt =
    decltype(composition(LayoutDO{}, make_layout(Shape<Int<kDv>, Int<kHeads>>{}, GenRowMajor{})));
using MmaKv =
    decltype(make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::MN, GMMA::Major::MN>{}));

template <bool Grad>
constexpr size_t bwd_smem_bytes() {
  return sizeof(bf16) * (kQElems + (Grad ? kDoElems : 0) + kKeyElems + 2 * kPElems) +
         sizeof(float) * (kKeys * kHeads + 2 * kHeads) + sizeof(int) * 2 * kKeys;
}
static_assert(bwd_smem_bytes<true>() <= 232448, "the backward's block fits");
static_assert(sizeof(bf16) * kDoElems % 1024 == 0 && sizeof(bf16) * kPElems % 1024 == 0,
              "every swizzled tile starts on 1 KiB");
static_assert(kHeads * kLdq <= kKeyElems, "dq's staging fits the key tile");

// A key-gradient chunk's accumulator (m64n64: value v of the thread at row_of(v), column
// 8 (v >> 2) + 2 (lane & 3) + (v & 1)) into the f32 rows of the listed keys, one float4 per
// lane and 8 columns: lanes c and c ^ 1 swap halves (even c: row g's columns 8 j + 2c .. + 3;
// odd c: row g + 8's 8 j + 2c - 2 .. + 1), as the mma.sync kernels' add_key_rows.
template <class Acc>
__device__ __forceinline__ void add_chunk(float* dst, const int* sl, int chunk, const Acc& acc,
                                          int w, int lane) {
  const int c = lane & 3;
  const bool even = (c & 1) == 0;
  const int s = sl[16 * w + (lane >> 2) + (even ? 0 : 8)];
  float* base =
      dst + static_cast<int64_t>(s < 0 ? 0 : s) * kDk + 64 * chunk + 2 * c - (even ? 0 : 2);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float c0 = acc(4 * j), c1 = acc(4 * j + 1), c2 = acc(4 * j + 2), c3 = acc(4 * j + 3);
    const float x0 = __shfl_xor_sync(0xffffffffu, even ? c2 : c0, 1);
    const float x1 = __shfl_xor_sync(0xffffffffu, even ? c3 : c1, 1);
    const float4 v = even ? make_float4(c0, c1, x0, x1) : make_float4(x0, x1, c2, c3);
    if (s >= 0) atomicAdd(reinterpret_cast<float4*>(base + 8 * j), v);
  }
}

template <bool Grad>
__global__ void __launch_bounds__(kBwdThreads, 1) mqa_bwd_wgmma_kernel(MqaWgmmaBwdArgs a) {
  extern __shared__ __align__(1024) unsigned char smem[];
  if (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) % 1024 != 0) __trap();
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* DOs = Qs + kQElems;  // dout (Grad only)
  bf16* Ks = DOs + (Grad ? kDoElems : 0);
  bf16* Ps = Ks + kKeyElems;
  bf16* Ds = Ps + kPElems;                             // scale dS
  float* xp = reinterpret_cast<float*>(Ds + kPElems);  // [16][128] WG0's fp32 P for WG1
  float* lse2 = xp + kKeys * kHeads;                   // [32] log2 units
  float* dl = lse2 + kHeads;                           // [32] Delta
  int* slots = reinterpret_cast<int*>(dl + kHeads);    // [2][kKeys]

  // Later queries first (the forward's order, for the same reason).
  const int64_t t = a.T - 1 - static_cast<int64_t>(blockIdx.x);
  const int valid = static_cast<int>(min(static_cast<int64_t>(kHeads), a.H));
  const int tid = threadIdx.x, wg = tid / kThreads, wt = tid % kThreads;
  const int lane = tid & 31, w = wt >> 5;  // w: the warp within its warpgroup
  const int32_t* row = a.idx + t * a.K;
  const bf16* kv = static_cast<const bf16*>(a.kv);
  const float scale_log2 = a.scale * kLog2e;

  // the block's q (and dout) rows, swizzled; heads past H zero
  stage_head_rows<LayoutQ, kDk, kBwdThreads>(Qs, static_cast<const bf16*>(a.q) + t * a.H * kDk,
                                             valid, tid);
  if constexpr (Grad)
    stage_head_rows<LayoutDO, kDv, kBwdThreads>(
        DOs, static_cast<const bf16*>(a.dout) + t * a.H * kDv, valid, tid);
  const int tiles = static_cast<int>((a.K + kKeys - 1) / kKeys);
  int32_t next[kPassesOf<kBwdThreads>];  // this thread's slot indices of tile it + 1
  slots_of<kBwdThreads>(next, row, 0, a.K);
  const uint32_t Kss = static_cast<uint32_t>(__cvta_generic_to_shared(Ks));
  if (tiles > 0) gather<kBwdThreads>(Kss, slots, kv, a.T, next);
  cp_async_commit();
  slots_of<kBwdThreads>(next, row, 1, a.K);

  // lse in log2 units (-inf for padded heads: P = 0 there) and Delta = o . dout per head, a warp
  // per head, 16 values a lane.
  for (int r = tid / 32; r < kHeads; r += kBwdThreads / 32) {
    float s = 0.f;
    if (Grad && r < valid) {
      const int64_t th = t * a.H + r;
      const bf16* orow = static_cast<const bf16*>(a.o) + th * kDv;
      const bf16* drow = static_cast<const bf16*>(a.dout) + th * kDv;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 ov = *reinterpret_cast<const uint4*>(orow + 8 * lane + 256 * h);
        const uint4 dv = *reinterpret_cast<const uint4*>(drow + 8 * lane + 256 * h);
        const bf16* oe = reinterpret_cast<const bf16*>(&ov);
        const bf16* de = reinterpret_cast<const bf16*>(&dv);
#pragma unroll
        for (int e = 0; e < 8; ++e) s += static_cast<float>(oe[e]) * static_cast<float>(de[e]);
      }
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) s += __shfl_xor_sync(0xffffffffu, s, x);
    if (lane == 0) {
      dl[r] = s;
      lse2[r] = r < valid ? a.lse[t * a.H + r] * kLog2e : -INFINITY;
    }
  }

  MmaS mma_s;
  auto ts = mma_s.get_thread_slice(wt);
  Tensor tSrQ = ts.partition_fragment_B(make_tensor(make_smem_ptr(Qs), LayoutQ{}));     // (,1,36)
  Tensor tSrDO = ts.partition_fragment_B(make_tensor(make_smem_ptr(DOs), LayoutDO{}));  // (,1,32)
  Tensor tSrK = ts.partition_fragment_A(make_tensor(make_smem_ptr(Ks), LayoutKeys{}));  // (,1,36)
  MmaO mma_q;
  auto tq = mma_q.get_thread_slice(wt);
  Tensor tQrKt = tq.partition_fragment_A(make_tensor(make_smem_ptr(Ks), LayoutKt{}));  // (,9,4)
  Tensor tQrD = tq.partition_fragment_B(make_tensor(make_smem_ptr(Ds), LayoutP{}));    // (,1,4)
  MmaKv mma_kv;
  auto tk = mma_kv.get_thread_slice(wt);
  Tensor tKrD = tk.partition_fragment_A(make_tensor(make_smem_ptr(Ds), LayoutPt{}));    // (,1,2)
  Tensor tKrP = tk.partition_fragment_A(make_tensor(make_smem_ptr(Ps), LayoutPt{}));    // (,1,2)
  Tensor tKrQ = tk.partition_fragment_B(make_tensor(make_smem_ptr(Qs), LayoutQt{}));    // (,9,2)
  Tensor tKrO = tk.partition_fragment_B(make_tensor(make_smem_ptr(DOs), LayoutDOt{}));  // (,8,2)
  static_assert(size<1>(decltype(tQrKt){}) == kDqTiles && size<1>(decltype(tKrQ){}) == kKvChunks &&
                    size<1>(decltype(tKrO){}) == kVChunks,
                "the M / N tiles the warpgroups share out");
  Tensor accS = partition_fragment_C(mma_s, Shape<Int<kKeys>, Int<kHeads>>{});  // S (WG0), dP (WG1)
  Tensor accQ = partition_fragment_C(mma_q, Shape<Int<64 * kDqTiles0>, Int<kHeads>>{});  // (16,5,1)
  Tensor accK0 = partition_fragment_C(mma_kv, Shape<Int<kKeys>, Int<64>>{});             // (32,1,1)
  Tensor accK1 = partition_fragment_C(mma_kv, Shape<Int<kKeys>, Int<64>>{});
  static_assert(size(decltype(accS){}) == 16 && size(decltype(accK0){}) == 32, "m64n32, m64n64");
  clear(accQ);
  uint32_t pb[4];  // this thread's stores into a LayoutP tile (p_addresses), offsets from Ps
  p_addresses(pb, static_cast<uint32_t>(__cvta_generic_to_shared(Ps)), w, lane);
  const uint32_t ds_off = static_cast<uint32_t>(sizeof(bf16) * kPElems);  // Ds - Ps, bytes

  // One warpgroup's share of dq^T += K^T dS^T: M tiles M0 .. M0 + N - 1.
  auto dq_mmas = [&](auto m0, auto n) {
    constexpr int M0 = decltype(m0)::value, N = decltype(n)::value;
    warpgroup_fence_operand(accQ);
    warpgroup_arrive();
#pragma unroll
    for (int mt = 0; mt < N; ++mt)
#pragma unroll
      for (int k = 0; k < size<2>(tQrKt); ++k) {
        auto d = accQ(_, mt, 0);
        cute::gemm(mma_q, tQrKt(_, M0 + mt, k), tQrD(_, 0, k), d);
      }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(accQ);
  };
  // A key-gradient chunk's MMAs into acc (committed as one group, not waited for).
  auto kv_mmas = [&](auto chunk, auto& acc) {
    constexpr int C = decltype(chunk)::value;
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    auto d = acc(_, 0, 0);
    mma_kv.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
    for (int k = 0; k < size<2>(tKrD); ++k) {
      cute::gemm(mma_kv, tKrD(_, 0, k), tKrQ(_, C, k), d);
      mma_kv.accumulate_ = GMMA::ScaleOut::One;
    }
    if constexpr (C < kVChunks)
#pragma unroll
      for (int k = 0; k < size<2>(tKrP); ++k) cute::gemm(mma_kv, tKrP(_, 0, k), tKrO(_, C, k), d);
    warpgroup_commit_batch();
  };
  // One warpgroup's key-gradient chunks C0 .. C1 - 1, two accumulators: chunk i + 1's MMAs run
  // while chunk i's reds go out.
  auto kv_chunks = [&](auto c0, auto c1, const int* sl) {
    constexpr int C0 = decltype(c0)::value, C1 = decltype(c1)::value;
    kv_mmas(Int<C0>{}, accK0);
    [&]<int... I>(std::integer_sequence<int, I...>) {
      (
          [&] {
            constexpr int C = C0 + I;
            auto& cur = (I % 2 == 0) ? accK0 : accK1;
            auto& nxt = (I % 2 == 0) ? accK1 : accK0;
            if constexpr (C + 1 < C1) {
              kv_mmas(Int<C + 1>{}, nxt);
              warpgroup_wait<1>();
            } else {
              warpgroup_wait<0>();
            }
            warpgroup_fence_operand(cur);
            add_chunk(a.dkv, sl, C, cur, w, lane);
          }(),
          ...);
    }
    (std::make_integer_sequence<int, C1 - C0>{});
  };

  for (int it = 0; it < tiles; ++it) {
    cp_async_wait_all();
    cutlass::arch::fence_view_async_shared();  // cp.async's and the zero stores for wgmma
    // Tile it landed (and, the first time, q, dout, lse2, Delta); every warp is done with tile
    // it - 1's P, dS and fp32 P (the key-gradient MMAs were waited for before their reds).
    __syncthreads();
    const int* sl = slots + (it & 1) * kKeys;
    auto issue_next = [&] {
      if (it + 1 < tiles) gather<kBwdThreads>(Kss, slots + ((it + 1) & 1) * kKeys, kv, a.T, next);
      cp_async_commit();
      slots_of<kBwdThreads>(next, row, it + 2, a.K);
    };
    if (!__any_sync(0xffffffffu, sl[lane] >= 0 || sl[lane + 32] >= 0)) {  // block-uniform
      const int64_t j = static_cast<int64_t>(it) * kKeys + tid;
      if (a.psum && tid < kKeys && j < a.K) a.psum[t * a.K + j] = 0.f;
      issue_next();  // nobody reads this tile's keys
      continue;
    }
    if (wg == 0) {  // S^T = K q^T, then P
      wgmma_product(mma_s, tSrK, tSrQ, accS);
      float rs[2] = {0.f, 0.f};  // the thread's two keys' P summed over its 8 heads
#pragma unroll
      for (int v = 0; v < 16; ++v) {
        const float l2 = lse2[col_of(col_slot(v), lane)];
        const bool ok = sl[row_of(v, w, lane)] >= 0 && l2 != -INFINITY;
        const float p = ok ? exp2f(accS(v) * scale_log2 - l2) : 0.f;
        rs[(v >> 1) & 1] += p;
        if constexpr (Grad) {
          xp[v * kThreads + wt] = p;
          st_shared_b16(pb[(v & 1) + 2 * ((v >> 1) & 1)] + 1024u * (v >> 2), bf16(p));
        }
      }
      if (a.psum) {  // the KL target: the heads of a key are the 4 lanes of equal lane / 4
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          rs[e] += __shfl_xor_sync(0xffffffffu, rs[e], 1);
          rs[e] += __shfl_xor_sync(0xffffffffu, rs[e], 2);
          const int64_t j = static_cast<int64_t>(it) * kKeys + 16 * w + (lane >> 2) + 8 * e;
          if ((lane & 3) == 0 && j < a.K) a.psum[t * a.K + j] = rs[e];
        }
      }
    } else if constexpr (Grad) {  // dP^T = V dout^T
      wgmma_product(mma_s, tSrK, tSrDO, accS);
    }
    if constexpr (!Grad) {
      __syncthreads();  // every warp is done with the key tile
      issue_next();
      continue;
    }
    __syncthreads();  // WG0's fp32 P
    if (wg == 1) {    // dS^T = scale P^T (dP^T - Delta)
#pragma unroll
      for (int v = 0; v < 16; ++v) {
        const float ds =
            a.scale * xp[v * kThreads + wt] * (accS(v) - dl[col_of(col_slot(v), lane)]);
        st_shared_b16(pb[(v & 1) + 2 * ((v >> 1) & 1)] + 1024u * (v >> 2) + ds_off, bf16(ds));
      }
    }
    cutlass::arch::fence_view_async_shared();  // P's and dS's stores for wgmma
    __syncthreads();                           // all of P and dS
    if (wg == 0)
      dq_mmas(Int<0>{}, Int<kDqTiles0>{});
    else
      dq_mmas(Int<kDqTiles0>{}, Int<kDqTiles - kDqTiles0>{});
    __syncthreads();  // every warp is done with the key tile
    issue_next();
    if (wg == 0)
      kv_chunks(Int<0>{}, Int<kKvChunks0>{}, sl);
    else
      kv_chunks(Int<kKvChunks0>{}, Int<kKvChunks>{}, sl);
  }
  cp_async_wait_all();
  if constexpr (!Grad) return;
  __syncthreads();  // every warp is done with the key tile
  // dq^T's accumulators into a [head][kLdq] staging tile (the key tile), then 16-byte row stores.
  bf16* Os = Ks;
  const int m0 = wg == 0 ? 0 : kDqTiles0, nm = wg == 0 ? kDqTiles0 : kDqTiles - kDqTiles0;
#pragma unroll
  for (int mt = 0; mt < kDqTiles0; ++mt)
    if (mt < nm)
#pragma unroll
      for (int v = 0; v < 16; ++v)
        Os[col_of(col_slot(v), lane) * kLdq + 64 * (m0 + mt) + row_of(v, w, lane)] =
            bf16(accQ(v, mt, 0));
  __syncthreads();
  bf16* dq = static_cast<bf16*>(a.dq) + t * a.H * kDk;
  for (int i = tid; i < valid * kChunks; i += kBwdThreads) {
    const int r = i / kChunks, c8 = (i % kChunks) * 8;
    *reinterpret_cast<uint4*>(dq + static_cast<int64_t>(r) * kDk + c8) =
        *reinterpret_cast<const uint4*>(Os + r * kLdq + c8);
  }
}

template <bool Grad>
cudaError_t launch_bwd(const MqaWgmmaBwdArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.H > kHeads) return cudaErrorInvalidValue;
  auto kernel = mqa_bwd_wgmma_kernel<Grad>;
  const size_t bytes = bwd_smem_bytes<Grad>();
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bytes));
  if (e != cudaSuccess) return e;
  kernel<<<dim3(static_cast<unsigned>(a.T)), kBwdThreads, bytes, s>>>(a);
  return cudaGetLastError();
}

}  // namespace

size_t sparse_mqa_fwd_wgmma_smem(int buffers) {
  return buffers == 1 ? smem_bytes<1>() : smem_bytes<2>();
}

cudaError_t sparse_mqa_fwd_wgmma(const MqaWgmmaArgs& a, int buffers, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (buffers != 1 && buffers != 2) return cudaErrorInvalidValue;
  auto kernel = buffers == 1 ? mqa_fwd_wgmma_kernel<1> : mqa_fwd_wgmma_kernel<2>;
  const size_t bytes = sparse_mqa_fwd_wgmma_smem(buffers);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes));
  // All of the SM's 228 KiB as shared memory, so that two one-buffer blocks fit.
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>((a.H + kHeads - 1) / kHeads));
  kernel<<<grid, kThreads, bytes, s>>>(a);
  return cudaGetLastError();
}

size_t sparse_mqa_bwd_wgmma_smem(bool grad) {
  return grad ? bwd_smem_bytes<true>() : bwd_smem_bytes<false>();
}

cudaError_t sparse_mqa_bwd_wgmma(const MqaWgmmaBwdArgs& a, cudaStream_t s) {
  return launch_bwd<true>(a, s);
}

cudaError_t sparse_mqa_prob_sum_wgmma(const MqaWgmmaBwdArgs& a, cudaStream_t s) {
  return launch_bwd<false>(a, s);
}

}  // namespace mt::ops::cuda
