// The chunked KDA backward's products (kda_chunk.cu, step 4) on tensor cores, for bf16 tensors at
// chunk 64 and head dims 64 or 128 (kda_bwd_tc.h). Per (chunk, head, job), sums over V:
//   job 0: dO S0^T -> dOS0, dR S0^T -> dRS0;  job 1: Delta dS^T -> Args::dds, S0 . dS -> gL;
//   job 2: scale dO Delta^T -> Aqk (j <= i), -dR Delta^T -> Tm (j < i), zero elsewhere,
// exactly the slots and meaning of products_kernel (ops/kda_chunk_layout.h), so the gradient
// pass is unchanged. None of
// these products carries a decay factor (the decays enter in the gradient pass), so they are
// plain matrix products. tf32 m16n8k8 MMAs with fp32 accumulation rather than bf16: S0, dS, Delta
// and dR are fp32 state-sized quantities whose magnitudes grow along a document; tf32 rounds them
// to 2^-11, below the 2^-9 of the bf16 inputs and outputs, where bf16 operands would double the
// error budget of the outputs (dO is bf16 already, exact in tf32).
// V runs in tiles of 32 columns through shared memory (rows of 36 floats: 4 mod 32 banks, so the
// A fragments of row-major tiles and the B fragments of the n-major ones, B(k, n) = M[n][k], are
// conflict-free): 46 KB at K = 128, several blocks per SM. Warp w owns rows 16 (w mod 4) .. +15
// and half of the output columns; job 2 skips the n-tiles wholly above the diagonal.
#include <algorithm>
#include <cstdint>

#include "core/cuda/resources.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_bwd_tc.h"
#include "ops/cuda/mma.cuh"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda::kda_detail {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kY = 32;       // V columns per shared tile
constexpr int kLd = kY + 4;  // tile row stride in floats
constexpr int kVec = 4;      // floats per vector load

template <int K>
constexpr int tile_rows() {
  return std::max(kC, K);
}

template <int K>
constexpr size_t products_smem() {
  return sizeof(float) * kLd * (kC + 2 * tile_rows<K>());
}

// Rows [0, Rows) of a source, 32 columns as fp32, zero from row `valid` on, into tile[r kLd + y]:
// load(r, x) reads row r's columns x .. x+3. All loads are issued before any store.
template <int Rows, typename Load>
__device__ __forceinline__ void stage(float* tile, int valid, Load load) {
  constexpr int kPerRow = kY / kVec, kIters = Rows * kPerRow / kThreads;
  static_assert(Rows * kPerRow % kThreads == 0, "whole rounds of vector loads");
  float4 v[kIters];
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int e = threadIdx.x + u * kThreads, r = e / kPerRow, x = (e % kPerRow) * kVec;
    v[u] = r < valid ? load(r, x) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int e = threadIdx.x + u * kThreads, r = e / kPerRow, x = (e % kPerRow) * kVec;
    *reinterpret_cast<float4*>(tile + r * kLd + x) = v[u];
  }
}

// An fp32 row-major source (row stride ld, first column at src), as stage reads it.
template <int Rows>
__device__ __forceinline__ void stage_f32(float* tile, int valid, const float* src, int ld) {
  stage<Rows>(tile, valid, [&](int r, int x) {
    return *reinterpret_cast<const float4*>(src + static_cast<int64_t>(r) * ld + x);
  });
}

// Four bf16 (8 bytes at p) widened exactly.
__device__ __forceinline__ float4 load4_bf16(const bf16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// The chunk's dO rows (bf16, row stride ld elements, first column at src).
__device__ __forceinline__ void stage_dout(float* tile, int valid, const bf16* src, int64_t ld) {
  stage<kC>(tile, valid, [&](int r, int x) { return load4_bf16(src + r * ld + x); });
}

// K rows of the chunk states from element e0 of the saved states (rows V apart): fp32, or bf16
// (Args::saved_h) widened exactly.
template <int Rows>
__device__ __forceinline__ void stage_states(float* tile, const Args& a, int64_t e0) {
  if (!a.saved_h) return stage_f32<Rows>(tile, Rows, a.saved + e0, a.V);
  stage<Rows>(tile, Rows, [&](int r, int x) {
    return load4_bf16(a.saved_h + e0 + static_cast<int64_t>(r) * a.V + x);
  });
}

// The tf32 B fragment (k0 .. k0+7, n0 .. n0+7) of B(k, n) = M[n][k], M an n-major tile.
__device__ __forceinline__ void load_b_nk(uint32_t b[2], const float* m, int n0, int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  b[0] = mma::to_tf32(m[(n0 + g) * kLd + k0 + c]);
  b[1] = mma::to_tf32(m[(n0 + g) * kLd + k0 + c + 4]);
}

__device__ __forceinline__ void store2(float* p, float lo, float hi) {
  *reinterpret_cast<float2*>(p) = make_float2(lo, hi);
}

template <int K, int V>
__global__ void __launch_bounds__(kThreads, 2) products_tc_kernel(Args a, const bf16* dout) {
  static_assert(V % kY == 0 && K % 16 == 0 && K <= 128, "whole tiles, eight n-tiles at most");
  static_assert(kWarps == 8 && kC == 64, "four row blocks by two column halves");
  constexpr int R = tile_rows<K>();
  const int64_t c = blockIdx.x, h = blockIdx.y;
  const int job = blockIdx.z;
  const int L = a.clen[c];
  if (L == 0) return;
  const int64_t t0 = a.ct0[c];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
  const int m0 = 16 * (w & 3);
  extern __shared__ __align__(16) unsigned char smem[];
  float* A1 = reinterpret_cast<float*>(smem);  // [64][kLd]: dO or Delta
  float* A2 = A1 + kC * kLd;                   // [R][kLd]: dR or S0
  float* Bt = A2 + R * kLd;                    // [R][kLd]: S0, dS or Delta (n-major)
  const KdaChunkLayout& lay = a.lay;
  float* blk = a.blk(c, h);
  const float* bb = a.bblk(c, h);
  const int64_t s0 = (c * a.H + h) * K * V;  // the chunk's states in `saved`
  const float* dSn = a.dS + (c * a.H + h) * K * V;
  const bf16* dO = dout + (t0 * a.H + h) * V;
  const int64_t ldo = a.H * V;
  if (job < 2) {
    constexpr int NT = K / 16;  // n-tiles of the warp's half of K
    const int n0 = (w >> 2) * (K / 2);
    float acc1[NT][4] = {}, acc2[NT][4] = {};
    float dot[K / kWarps] = {};  // job 1: rows w + 8 u of S0 . dS, the lane's column of the tile
    for (int y0 = 0; y0 < V; y0 += kY) {
      __syncthreads();  // the previous tile is consumed
      if (job == 0) {
        stage_dout(A1, L, dO + y0, ldo);
        stage_f32<kC>(A2, L, bb + lay.dR() + y0, V);
        stage_states<K>(Bt, a, s0 + y0);
      } else {
        stage_f32<kC>(A1, L, bb + lay.D() + y0, V);
        stage_states<K>(A2, a, s0 + y0);
        stage_f32<K>(Bt, K, dSn + y0, V);
      }
      __syncthreads();
#pragma unroll
      for (int k0 = 0; k0 < kY; k0 += 8) {
        uint32_t a1[4], a2[4] = {};
        mma::load_a_tf32<false>(a1, A1, kLd, m0, k0, lane);
        if (job == 0) mma::load_a_tf32<false>(a2, A2, kLd, m0, k0, lane);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t b[2];
          load_b_nk(b, Bt, n0 + 8 * nt, k0, lane);
          mma::mma_tf32(acc1[nt], a1, b);
          if (job == 0) mma::mma_tf32(acc2[nt], a2, b);
        }
      }
      if (job == 1) {
#pragma unroll
        for (int u = 0; u < K / kWarps; ++u) {
          const int x = w + kWarps * u;
          dot[u] += A2[x * kLd + lane] * Bt[x * kLd + lane];
        }
      }
    }
    // Job 1 may write into the dS slot it read (the bf16 layout, Args::dds): every read of it
    // lies before the last tile's barrier, and no other block reads it.
    float* out1 = job == 0 ? blk + lay.dOS0() : a.dds(c, h);
    float* out2 = blk + lay.dRS0();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int at = (m0 + g + 8 * hf) * K + n0 + 8 * nt + 2 * q4;
        store2(out1 + at, acc1[nt][2 * hf], acc1[nt][2 * hf + 1]);
        if (job == 0) store2(out2 + at, acc2[nt][2 * hf], acc2[nt][2 * hf + 1]);
      }
    if (job == 1) {
#pragma unroll
      for (int u = 0; u < K / kWarps; ++u) {
        const float s = warp_sum(dot[u]);
        if (lane == 0) blk[lay.gL() + w + kWarps * u] = s;
      }
    }
  } else {
    const int n0 = 32 * (w >> 2);  // the warp's half of the chunk's 64 columns
    float tq[4][4] = {}, ta[4][4] = {};
    for (int y0 = 0; y0 < V; y0 += kY) {
      __syncthreads();
      stage_dout(A1, L, dO + y0, ldo);
      stage_f32<kC>(A2, L, bb + lay.dR() + y0, V);
      stage_f32<kC>(Bt, L, bb + lay.D() + y0, V);
      __syncthreads();
#pragma unroll
      for (int k0 = 0; k0 < kY; k0 += 8) {
        uint32_t a1[4], a2[4];
        mma::load_a_tf32<false>(a1, A1, kLd, m0, k0, lane);
        mma::load_a_tf32<false>(a2, A2, kLd, m0, k0, lane);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          if (n0 + 8 * nt <= m0 + 15) {  // some j <= i in the tile
            uint32_t b[2];
            load_b_nk(b, Bt, n0 + 8 * nt, k0, lane);
            mma::mma_tf32(tq[nt], a1, b);
            mma::mma_tf32(ta[nt], a2, b);
          }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + g + 8 * hf, j = n0 + 8 * nt + 2 * q4;
        const float* q = tq[nt] + 2 * hf;
        const float* r = ta[nt] + 2 * hf;
        store2(blk + lay.Aqk() + i * kC + j, j <= i ? a.scale * q[0] : 0.f,
               j + 1 <= i ? a.scale * q[1] : 0.f);
        store2(blk + lay.Tm() + i * kC + j, j < i ? -r[0] : 0.f, j + 1 < i ? -r[1] : 0.f);
      }
  }
}

// ---- products v2 (KdaKernels::products_v2, the default) ----
// One persistent block per SM runs all three jobs of a (chunk, head) item, so that each input is
// read from HBM once: 208 KB of reads per item at K = V = 128 instead of v1's 352 (dO and dR by
// jobs 0 and 2, S0 by 0 and 1, Delta by 1 and 2), plus the same 128 KB of writes. 16 warps:
// warps 0-7 job 0 (64 accumulators each), warps 8-15 jobs 1 and 2 (32 + 32), so the two roles
// hold equal registers; the S0 . dS row dots are spread over all 512 threads (one accumulator).
// The 32-column V tiles of every operand flow through a three-stage cp.async ring that runs on
// across items, so the next item's first tiles load while this one's last computes and its
// outputs are stored; one barrier per tile. Fragments come through ldmatrix (fp32 data read as
// b16 pairs: an 8x4 fp32 block is an 8x8 b16 matrix, and its lane layout is the tf32 fragment's);
// dO stays bf16 in shared memory (16-byte copies) and widens exactly on the fragment load. The
// MMA sequence per output is v1's, so dOS0, dRS0, dds, Aqk and Tm are bit-identical; gL's sum
// runs in another order.
namespace v2 {

constexpr int kThreads = 512;
constexpr int kStages = 3;
constexpr int kLdh = kY + 8;  // dO tile row stride in bf16 (80 bytes: conflict-free fragments)

template <int K>
struct Stage {
  static constexpr int kO = 0;                   // bf16 [64][kLdh]
  static constexpr int kR = kC * kLdh * 2;       // fp32 [64][kLd]: dR
  static constexpr int kD = kR + kC * kLd * 4;   // fp32 [64][kLd]: Delta
  static constexpr int kS0 = kD + kC * kLd * 4;  // fp32 [K][kLd]
  static constexpr int kDS = kS0 + K * kLd * 4;  // fp32 [K][kLd]: dS
  static constexpr int kBytes = kDS + K * kLd * 4;
};

template <int K>
constexpr size_t smem() {
  return static_cast<size_t>(kStages) * Stage<K>::kBytes;
}

// 16 bytes global -> shared, or 16 zero bytes when !valid (src-size 0 reads nothing).
__device__ __forceinline__ void cp16(void* dst, const void* src, bool valid) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
               "r"(valid ? 16 : 0));
}

// The roles call the barrier from different code sites (warp-uniform branches): the non-.aligned
// form allows that.
__device__ __forceinline__ void block_sync() {
  asm volatile("barrier.sync 0;\n" ::: "memory");
}

// ldmatrix .x4 of four 8x4 fp32 blocks (this lane's row address p), each register rounded to
// tf32: lanes 8i .. 8i+7 address block i's rows.
__device__ __forceinline__ void ldsm_tf32(uint32_t r[4], const float* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = mma::to_tf32(__uint_as_float(r[i]));
}

// The tf32 A fragment (rows m0 .. m0+15, k0 .. k0+7) of a row-major fp32 tile: blocks (rows 0-7,
// k 0-3), (8-15, 0-3), (0-7, 4-7), (8-15, 4-7) are a0 .. a3.
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const float* t, int m0, int k0, int lane) {
  ldsm_tf32(a, t + (m0 + (lane & 15)) * kLd + k0 + (lane >> 4) * 4);
}

// The B fragments (k0 .. k0+7) of n-tiles n0 and n0 + 8 of B(k, n) = M[n][k]: blocks (n 0-7, k
// 0-3), (n 0-7, k 4-7), (n 8-15, k 0-3), (n 8-15, k 4-7).
__device__ __forceinline__ void ldsm_b2(uint32_t b0[2], uint32_t b1[2], const float* m, int n0,
                                        int k0, int lane) {
  uint32_t r[4];
  ldsm_tf32(r, m + (n0 + (lane & 7) + (lane >> 4) * 8) * kLd + k0 + ((lane >> 3) & 1) * 4);
  b0[0] = r[0];
  b0[1] = r[1];
  b1[0] = r[2];
  b1[1] = r[3];
}

// The A fragment of the bf16 dO tile, widened exactly.
__device__ __forceinline__ void load_a_bf16(uint32_t a[4], const bf16* t, int m0, int k0,
                                            int lane) {
  const int g = lane >> 2, c = lane & 3;
  const bf16* p = t + (m0 + g) * kLdh + k0 + c;
  a[0] = mma::to_tf32(p[0]);
  a[1] = mma::to_tf32(p[8 * kLdh]);
  a[2] = mma::to_tf32(p[4]);
  a[3] = mma::to_tf32(p[8 * kLdh + 4]);
}

// Items (chunk, head) = (i / H, i % H) with i = blockIdx.x + n gridDim.x, skipping unused chunks
// (int: launch_v2 checks that chunks x heads fits).
__device__ __forceinline__ int next_item(const Args& a, int i) {
  const int n = static_cast<int>(a.nchunks * a.H), H = static_cast<int>(a.H);
  while (i < n && a.clen[i / H] == 0) i += gridDim.x;
  return i;
}

// Issues the copies of item i's V columns y0 .. y0+31 into stage `st` (one commit group). Every
// thread copies the same (row, 4 columns) piece of dR and Delta, row + 64 u of S0 and dS, and
// threads 0-255 one 8-column piece of dO.
template <int K, int V>
__device__ __forceinline__ void issue(const Args& a, const bf16* dout, unsigned char* st, int i,
                                      int y0) {
  using S = Stage<K>;
  static_assert(kThreads == kC * 8, "a thread per (row, 4 columns) of a 64-row tile");
  const int H = static_cast<int>(a.H), c = i / H, h = i - c * H;
  const int L = a.clen[c];
  const int tid = threadIdx.x, r = tid >> 3, x = (tid & 7) * 4;
  if (tid < kC * 4) {
    const int ro = tid >> 2, xo = (tid & 3) * 8;
    const bool ok = ro < L;
    const bf16* src =
        dout + ((static_cast<int64_t>(a.ct0[c]) + (ok ? ro : 0)) * H + h) * V + y0 + xo;
    cp16(st + S::kO + (ro * kLdh + xo) * 2, src, ok);
  }
  const float* bb = a.bblk(c, h) + (r < L ? r * V : 0) + y0 + x;
  cp16(st + S::kR + (r * kLd + x) * 4, bb + a.lay.dR(), r < L);
  cp16(st + S::kD + (r * kLd + x) * 4, bb + a.lay.D(), r < L);
  const int64_t sb = static_cast<int64_t>(i) * K * V + r * V + y0 + x;
#pragma unroll
  for (int u = 0; u < K / kC; ++u) {
    if (!a.saved_h)  // bf16 states: Ring::take_states
      cp16(st + S::kS0 + ((r + kC * u) * kLd + x) * 4, a.saved + sb + kC * u * V, true);
    cp16(st + S::kDS + ((r + kC * u) * kLd + x) * 4, a.dS + sb + kC * u * V, true);
  }
}

// The ring: the producer cursor (item, y0) runs kStages - 1 tiles ahead of the consumer.
// bf16 chunk states (Args::saved_h) cannot take cp.async into the fp32 S0 tile, which the
// fragments read as it is: each thread loads its 8 of a tile's states into registers when it
// issues the tile's copies (take_states) and widens them into the stage at its next produce
// (put_states), a tile step later and still a barrier before the stage is consumed.
struct Ring {
  int item;
  int y0;
  uint4 states = make_uint4(0u, 0u, 0u, 0u);
  int states_at = -1;  // float offset of the pending states in the ring's shared memory
};

// The thread's 8 bf16 states (row tid / 4, columns y0 + 8 (tid mod 4) ..) of item i's tile into
// r.states, bound for stage `st` (float offset st_at of the ring).
template <int K, int V>
__device__ __forceinline__ void take_states(const Args& a, Ring& r, int i, int y0, int st_at) {
  using S = Stage<K>;
  const int tid = threadIdx.x, row = tid >> 2, q = (tid & 3) * 8;
  if (row >= K) return;
  r.states = *reinterpret_cast<const uint4*>(a.saved_h + static_cast<int64_t>(i) * K * V + row * V +
                                             y0 + q);
  r.states_at = st_at + S::kS0 / 4 + row * kLd + q;
}

__device__ __forceinline__ void put_states(float* ring, Ring& r) {
  if (r.states_at < 0) return;
  const uint32_t w[4] = {r.states.x, r.states.y, r.states.z, r.states.w};
  float4* d = reinterpret_cast<float4*>(ring + r.states_at);
  d[0] = make_float4(__uint_as_float(w[0] << 16), __uint_as_float(w[0] & 0xffff0000u),
                     __uint_as_float(w[1] << 16), __uint_as_float(w[1] & 0xffff0000u));
  d[1] = make_float4(__uint_as_float(w[2] << 16), __uint_as_float(w[2] & 0xffff0000u),
                     __uint_as_float(w[3] << 16), __uint_as_float(w[3] & 0xffff0000u));
  r.states_at = -1;
}

template <int V>
__device__ __forceinline__ void step(const Args& a, Ring& r) {
  r.y0 += kY;
  if (r.y0 == V) {
    r.y0 = 0;
    r.item = next_item(a, r.item + gridDim.x);
  }
}

// The lines of item i's tile y0 into L2 (KdaKernels::products_prefetch): one line per thread, S0's
// and dS's K rows (128 bytes of a tile row: one line; 64 of bf16 states), then dR's, Delta's and
// dO's rows below L. Issued kPrefetch tiles ahead of the cp.async copies, so that these meet L2's
// latency: the ring alone keeps two tiles (~100 KB) in flight per SM, which at HBM's loaded latency
// held v2 near 2.2 TB/s under ncu. Two tiles (~10 us) ahead, so that the lines are still in L2 when
// copied.
constexpr int kPrefetch = 2;
template <int K, int V>
__device__ __forceinline__ void prefetch_tile(const Args& a, const bf16* dout, int i, int y0) {
  static_assert(2 * K + 3 * kC <= kThreads, "one line per thread");
  const int H = static_cast<int>(a.H), c = i / H, h = i - c * H;
  const int e = threadIdx.x;
  const char* p = nullptr;
  if (e < 2 * K) {
    const int64_t at = static_cast<int64_t>(i) * K * V + (e % K) * V + y0;
    p = e >= K      ? reinterpret_cast<const char*>(a.dS + at)
        : a.saved_h ? reinterpret_cast<const char*>(a.saved_h + at)
                    : reinterpret_cast<const char*>(a.saved + at);
  } else if (e < 2 * K + 3 * kC) {
    const int r = (e - 2 * K) % kC, which = (e - 2 * K) / kC;
    if (r >= a.clen[c]) return;
    p = which == 2 ? reinterpret_cast<const char*>(
                         dout + ((static_cast<int64_t>(a.ct0[c]) + r) * H + h) * V + y0)
                   : reinterpret_cast<const char*>(a.bblk(c, h) + (which ? a.lay.D() : a.lay.dR()) +
                                                   r * V + y0);
  } else {
    return;
  }
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// f: the prefetch cursor, kPrefetch tiles ahead of p (f.item < 0: no prefetch).
template <int K, int V>
__device__ __forceinline__ void produce(const Args& a, const bf16* dout, unsigned char* smem,
                                        Ring& p, Ring& f, int st) {
  if (a.saved_h) put_states(reinterpret_cast<float*>(smem), p);
  if (p.item < a.nchunks * a.H) {
    issue<K, V>(a, dout, smem + st * Stage<K>::kBytes, p.item, p.y0);
    if (a.saved_h) take_states<K, V>(a, p, p.item, p.y0, st * Stage<K>::kBytes / 4);
    step<V>(a, p);
  }
  mma::cp_async_commit();  // empty groups too, so that wait_group counts tiles
  if (f.item >= 0 && f.item < a.nchunks * a.H) {
    prefetch_tile<K, V>(a, dout, f.item, f.y0);
    step<V>(a, f);
  }
}

// Waits for the consumer's stage, frees the previous one for the producer, returns the stage.
template <int K, int V>
__device__ __forceinline__ const unsigned char* advance(const Args& a, const bf16* dout,
                                                        unsigned char* smem, Ring& p, Ring& f,
                                                        int& st) {
  mma::cp_async_wait<kStages - 2>();
  block_sync();  // the stage has landed for all threads; all are done with the previous one
  produce<K, V>(a, dout, smem, p, f, st == 0 ? kStages - 1 : st - 1);
  const unsigned char* cur = smem + st * Stage<K>::kBytes;
  st = st + 1 == kStages ? 0 : st + 1;
  return cur;
}

// S0 . dS over the tile's 32 columns, K rows spread over all threads: kThreads / K per row.
template <int K>
__device__ __forceinline__ float row_dot(const unsigned char* cur, float acc) {
  using S = Stage<K>;
  constexpr int kTpr = kThreads / K, kCols = kY / kTpr;
  const int r = threadIdx.x / kTpr, x = (threadIdx.x % kTpr) * kCols;
  const float* s0 = reinterpret_cast<const float*>(cur + S::kS0) + r * kLd + x;
  const float* ds = reinterpret_cast<const float*>(cur + S::kDS) + r * kLd + x;
#pragma unroll
  for (int j = 0; j < kCols; j += 4) {
    const float4 u = *reinterpret_cast<const float4*>(s0 + j);
    const float4 v = *reinterpret_cast<const float4*>(ds + j);
    acc += u.x * v.x + u.y * v.y + u.z * v.z + u.w * v.w;
  }
  return acc;
}

template <int K>
__device__ __forceinline__ void store_dot(const Args& a, float* blk, float acc) {
  constexpr int kTpr = kThreads / K;
#pragma unroll
  for (int o = kTpr / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % kTpr == 0) blk[a.lay.gL() + threadIdx.x / kTpr] = acc;
}

// Warps 0-7: job 0 (dO S0^T, dR S0^T), v1's tiling.
template <int K, int V>
__device__ __forceinline__ void run_job0(const Args& a, const bf16* dout, unsigned char* smem,
                                         Ring& p, Ring& f, int st, int item) {
  using S = Stage<K>;
  constexpr int NT = K / 16;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
  const int m0 = 16 * (w & 3), n0 = (w >> 2) * (K / 2);
  for (; item < a.nchunks * a.H; item = next_item(a, item + gridDim.x)) {
    float acc1[NT][4] = {}, acc2[NT][4] = {};
    float dot = 0.f;
    for (int y0 = 0; y0 < V; y0 += kY) {
      const unsigned char* cur = advance<K, V>(a, dout, smem, p, f, st);
      const bf16* tO = reinterpret_cast<const bf16*>(cur + S::kO);
      const float* tR = reinterpret_cast<const float*>(cur + S::kR);
      const float* tS0 = reinterpret_cast<const float*>(cur + S::kS0);
#pragma unroll
      for (int k0 = 0; k0 < kY; k0 += 8) {
        uint32_t a1[4], a2[4];
        load_a_bf16(a1, tO, m0, k0, lane);
        ldsm_a(a2, tR, m0, k0, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
          uint32_t b0[2], b1[2];
          ldsm_b2(b0, b1, tS0, n0 + 8 * nt, k0, lane);
          mma::mma_tf32(acc1[nt], a1, b0);
          mma::mma_tf32(acc2[nt], a2, b0);
          mma::mma_tf32(acc1[nt + 1], a1, b1);
          mma::mma_tf32(acc2[nt + 1], a2, b1);
        }
      }
      dot = row_dot<K>(cur, dot);
    }
    const int64_t c = item / a.H, h = item % a.H;
    float* blk = a.blk(c, h);
    float* out1 = blk + a.lay.dOS0();
    float* out2 = blk + a.lay.dRS0();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int at = (m0 + g + 8 * hf) * K + n0 + 8 * nt + 2 * q4;
        store2(out1 + at, acc1[nt][2 * hf], acc1[nt][2 * hf + 1]);
        store2(out2 + at, acc2[nt][2 * hf], acc2[nt][2 * hf + 1]);
      }
    store_dot<K>(a, blk, dot);
  }
}

// Warps 8-15: job 1 (Delta dS^T) and job 2 (dO Delta^T, dR Delta^T below the diagonal).
template <int K, int V>
__device__ __forceinline__ void run_job12(const Args& a, const bf16* dout, unsigned char* smem,
                                          Ring& p, Ring& f, int st, int item) {
  using S = Stage<K>;
  constexpr int NT = K / 16;
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) - 8, g = lane >> 2, q4 = lane & 3;
  const int m0 = 16 * (w & 3), n0 = (w >> 2) * (K / 2), n2 = 32 * (w >> 2);
  for (; item < a.nchunks * a.H; item = next_item(a, item + gridDim.x)) {
    float acc[NT][4] = {}, tq[4][4] = {}, ta[4][4] = {};
    float dot = 0.f;
    for (int y0 = 0; y0 < V; y0 += kY) {
      const unsigned char* cur = advance<K, V>(a, dout, smem, p, f, st);
      const bf16* tO = reinterpret_cast<const bf16*>(cur + S::kO);
      const float* tR = reinterpret_cast<const float*>(cur + S::kR);
      const float* tD = reinterpret_cast<const float*>(cur + S::kD);
      const float* tDS = reinterpret_cast<const float*>(cur + S::kDS);
#pragma unroll
      for (int k0 = 0; k0 < kY; k0 += 8) {
        uint32_t ad[4];
        ldsm_a(ad, tD, m0, k0, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
          uint32_t b0[2], b1[2];
          ldsm_b2(b0, b1, tDS, n0 + 8 * nt, k0, lane);
          mma::mma_tf32(acc[nt], ad, b0);
          mma::mma_tf32(acc[nt + 1], ad, b1);
        }
        uint32_t a1[4], a2[4];
        load_a_bf16(a1, tO, m0, k0, lane);
        ldsm_a(a2, tR, m0, k0, lane);
#pragma unroll
        for (int nt = 0; nt < 4; nt += 2)
          if (n2 + 8 * nt <= m0) {  // both n-tiles hold some j <= i (m0, n2 multiples of 16)
            uint32_t b0[2], b1[2];
            ldsm_b2(b0, b1, tD, n2 + 8 * nt, k0, lane);
            mma::mma_tf32(tq[nt], a1, b0);
            mma::mma_tf32(ta[nt], a2, b0);
            mma::mma_tf32(tq[nt + 1], a1, b1);
            mma::mma_tf32(ta[nt + 1], a2, b1);
          }
      }
      dot = row_dot<K>(cur, dot);
    }
    const int64_t c = item / a.H, h = item % a.H;
    float* blk = a.blk(c, h);
    // dds may alias the dS slot this item read: every copy of it landed before the last tile's
    // barrier, the copies in flight now are later items', and no other block reads it.
    float* out = a.dds(c, h);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int at = (m0 + g + 8 * hf) * K + n0 + 8 * nt + 2 * q4;
        store2(out + at, acc[nt][2 * hf], acc[nt][2 * hf + 1]);
      }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + g + 8 * hf, j = n2 + 8 * nt + 2 * q4;
        const float* q = tq[nt] + 2 * hf;
        const float* r = ta[nt] + 2 * hf;
        store2(blk + a.lay.Aqk() + i * kC + j, j <= i ? a.scale * q[0] : 0.f,
               j + 1 <= i ? a.scale * q[1] : 0.f);
        store2(blk + a.lay.Tm() + i * kC + j, j < i ? -r[0] : 0.f, j + 1 < i ? -r[1] : 0.f);
      }
    store_dot<K>(a, blk, dot);
  }
}

template <int K, int V>
__global__ void __launch_bounds__(kThreads, 1)
    products_v2_kernel(Args a, const bf16* dout, bool prefetch) {
  static_assert(V % kY == 0 && (K == 64 || K == 128), "whole tiles; 512 / K threads per dot row");
  extern __shared__ __align__(16) unsigned char smem[];
  const int first = next_item(a, static_cast<int>(blockIdx.x));
  Ring p{first, 0}, f{prefetch ? first : -1, 0}, none{-1, 0};
  if (prefetch)
    for (int s = 0; s < kStages - 1 + kPrefetch && f.item < a.nchunks * a.H; ++s) step<V>(a, f);
  for (int s = 0; s < kStages - 1; ++s) produce<K, V>(a, dout, smem, p, none, s);
  if (threadIdx.x < 256)
    run_job0<K, V>(a, dout, smem, p, f, 0, first);
  else
    run_job12<K, V>(a, dout, smem, p, f, 0, first);
  mma::cp_async_wait<0>();  // only empty groups remain; leave none behind
}

}  // namespace v2

template <int K, int V>
void launch_v2(Context& ctx, const Args& a, const bf16* dout) {
  const size_t sm = smem_for(v2::products_v2_kernel<K, V>, v2::smem<K>(), "kda_backward");
  const int64_t items = a.nchunks * a.H;
  MT_CHECK(items < (int64_t{1} << 30), ValueError, "kda products: ", items, " chunk-heads");
  const int64_t blocks = std::min<int64_t>(items, cuda_resources(ctx).multiprocessors);
  if (blocks == 0) return;
  v2::products_v2_kernel<K, V><<<static_cast<unsigned>(blocks), v2::kThreads, sm, stream(ctx)>>>(
      a, dout, a.kernels.products_prefetch);
  MT_CUDA_LAUNCH_CHECK();
}

template <int K, int V>
void launch(Context& ctx, const Args& a, const bf16* dout) {
  const size_t sm = smem_for(products_tc_kernel<K, V>, products_smem<K>(), "kda_backward");
  products_tc_kernel<K, V><<<dim3(static_cast<unsigned>(a.nchunks), static_cast<unsigned>(a.H), 3),
                             kThreads, sm, stream(ctx)>>>(a, dout);
  MT_CUDA_LAUNCH_CHECK();
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

bool products_tc_fits(const Args& a, const void* dout) {
  const KdaParams p{.head_k = a.K, .head_v = a.V, .chunk = a.C, .kernels = a.kernels};
  return kda_bf16_prep_path(p) == KdaPrepPath::TensorCoreBf16 && aligned16(dout) &&
         aligned16(a.saved) && aligned16(a.saved_h) && aligned16(a.ws) && aligned16(a.back) &&
         aligned16(a.dS);
}

void products_tc(Context& ctx, const Args& a, const bf16* dout) {
  MT_CHECK((a.K == 64 || a.K == 128) && (a.V == 64 || a.V == 128), ValueError,
           "kda tensor-core products: head_k ", a.K, " head_v ", a.V,
           " (products_tc_fits admits 64 and 128)");
  if (a.kernels.products_v2) {
    if (a.K == 64)
      return a.V == 64 ? launch_v2<64, 64>(ctx, a, dout) : launch_v2<64, 128>(ctx, a, dout);
    return a.V == 64 ? launch_v2<128, 64>(ctx, a, dout) : launch_v2<128, 128>(ctx, a, dout);
  }
  if (a.K == 64) return a.V == 64 ? launch<64, 64>(ctx, a, dout) : launch<64, 128>(ctx, a, dout);
  return a.V == 64 ? launch<128, 64>(ctx, a, dout) : launch<128, 128>(ctx, a, dout);
}

}  // namespace mt::ops::cuda::kda_detail
