// The KDA core on the GPU, direct version: both algorithms of ops/kda.h run the token recurrence
// (they are the same function; the chunked flag only decides which states `saved` keeps: the one
// entering every token, or the one entering every chunk).
//
// Column j of the state S [K, V] evolves on its own: s_j <- e^g . s_j, then
// s_j += beta k (v_j - k . s_j), and o_j = scale q . s_j. So a (document, head) is split over V
// into up to 8 slices, one block each; a warp owns 4 columns, its lanes split the K rows (KR rows
// per lane), and the state lives in registers in fp32. The per-column reductions over K are warp
// shuffles.
//
// Backward walks the segments (chunks, or single tokens) of a document in reverse. For each
// window of W tokens it recomputes the states entering them from the segment's saved state (the
// same step code as forward, so bit for bit the forward's states), keeps them in shared memory,
// and runs the reverse step, which is again per column for the state gradient dS. dq, dk, dg and
// dbeta sum over all V columns: each warp leaves per-row partial sums in shared memory, and the
// slices of one (document, head) form a thread-block cluster that adds them up in a fixed order
// through distributed shared memory (deterministic, no atomics).
#include <cooperative_groups.h>

#include <algorithm>
#include <utility>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kda_chunk.h"
#include "ops/kda.h"
#include "ops/kda_prep_path.h"

namespace mt::ops::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kCols = 4;       // state columns per warp
constexpr int kMaxSlices = 8;  // blocks per (document, head): a portable cluster size
constexpr int kMaxWarps = 8;   // so head_v <= kMaxSlices * kMaxWarps * kCols = 256
constexpr int kMaxK = 256;     // KR = 8 rows per lane
constexpr int kParts = 4;      // per-row partials of the reverse step (see kda_bwd_kernel)
constexpr size_t kSmemBudget = 96 << 10;

// How V is split: `slices` blocks of `warps` warps, each block `cols` = warps * kCols columns wide.
struct Split {
  int slices, warps, cols;
};

Split split_of(int64_t V) {
  Split s;
  s.slices = static_cast<int>(std::min<int64_t>(kMaxSlices, std::max<int64_t>(1, (V + 15) / 16)));
  const int64_t width = (V + s.slices - 1) / s.slices;
  s.warps = static_cast<int>((width + kCols - 1) / kCols);
  s.cols = s.warps * kCols;
  return s;
}

struct Args {
  int64_t T, H, K, V, N;
  int64_t seg;         // tokens per segment: the chunk (chunked) or 1 (recurrent)
  int64_t saved_rows;  // saved.dim(0), to keep writes inside it whatever cu_seqlens holds
  float scale;
  int cols;  // columns per block (Split::cols)
  int W;     // backward: tokens per window
  const int32_t* cu;
  const float *g, *beta, *h0, *dhT;
  float *hT, *saved, *dg, *dbeta, *dh0;
};

// Where a document's tokens and its saved rows are. Offsets are not validated on the host (they
// live on the device): a document whose offsets are out of order or out of range, or whose saved
// rows would not fit, is skipped (its outputs stay unwritten; docs/gpu.md).
struct Doc {
  int64_t t0, t1, row0;
  bool ok;
};

__device__ Doc doc_info(const Args& a, int64_t n) {
  const int lane = threadIdx.x & 31;
  long long rows = 0;
  int bad = 0;
  for (int64_t m = lane; m < n; m += 32) {
    const int64_t len = static_cast<int64_t>(a.cu[m + 1]) - a.cu[m];
    bad |= len < 0;
    rows += len < 0 ? 0 : (len + a.seg - 1) / a.seg;
  }
  for (int o = 16; o > 0; o >>= 1) rows += __shfl_xor_sync(0xffffffffu, rows, o);
  bad = __any_sync(0xffffffffu, bad);
  Doc d;
  d.t0 = a.cu[n];
  d.t1 = a.cu[n + 1];
  d.row0 = rows;
  d.ok = !bad && a.cu[0] == 0 && d.t0 >= 0 && d.t0 <= d.t1 && d.t1 <= a.T &&
         d.row0 + (d.t1 - d.t0 + a.seg - 1) / a.seg <= a.saved_rows;
  return d;
}

// A thread's place in the state: rows lane + 32 r (r < KR) and the columns col[c] (c < kCols).
template <int KR>
struct Tile {
  int64_t col[kCols];
  bool valid[kCols];
  int lane, warp;

  __device__ Tile(const Args& a) {
    lane = threadIdx.x & 31;
    warp = threadIdx.x >> 5;
    for (int c = 0; c < kCols; ++c) {
      const int local = warp * kCols + c;
      col[c] = static_cast<int64_t>(blockIdx.y) * a.cols + local;
      valid[c] = col[c] < a.V;
    }
  }
  __device__ int64_t row(int r) const { return lane + 32 * r; }
  __device__ bool has(int r, int c, const Args& a) const { return row(r) < a.K && valid[c]; }

  // Loads a [K, V] state at `base` (zeros where absent or outside the state).
  __device__ void load(float (&S)[KR][kCols], const float* base, const Args& a) const {
    for (int r = 0; r < KR; ++r)
      for (int c = 0; c < kCols; ++c)
        S[r][c] = base && has(r, c, a) ? base[row(r) * a.V + col[c]] : 0.f;
  }
  __device__ void store(const float (&S)[KR][kCols], float* base, const Args& a) const {
    for (int r = 0; r < KR; ++r)
      for (int c = 0; c < kCols; ++c)
        if (has(r, c, a)) base[row(r) * a.V + col[c]] = S[r][c];
  }
};

// One token of the recurrence on the thread's part of S (rows past K hold zeros and keep them:
// k = q = 0 and e = 1 there; columns past V likewise, with v = 0). Returns nothing; o_t is
// written when `o` is given.
template <typename T, int KR>
__device__ __forceinline__ void fwd_step(float (&S)[KR][kCols], const Tile<KR>& tl, const Args& a,
                                         int64_t t, int64_t h, const T* k, const T* v, const T* q,
                                         T* o) {
  const int64_t r = t * a.H + h;
  float kk[KR], ee[KR];
  for (int i = 0; i < KR; ++i) {
    const int64_t x = tl.row(i);
    kk[i] = x < a.K ? ld(k, r * a.K + x) : 0.f;
    ee[i] = x < a.K ? expf(a.g[r * a.K + x]) : 1.f;
  }
  const float b = a.beta[r];
  float kv[kCols];
  for (int c = 0; c < kCols; ++c) {
    float s = 0.f;
    for (int i = 0; i < KR; ++i) {
      S[i][c] *= ee[i];
      s += kk[i] * S[i][c];
    }
    kv[c] = s;
  }
  for (int c = 0; c < kCols; ++c) kv[c] = warp_sum(kv[c]);
  for (int c = 0; c < kCols; ++c) {
    const float u = (tl.valid[c] ? ld(v, r * a.V + tl.col[c]) : 0.f) - kv[c];
    for (int i = 0; i < KR; ++i) S[i][c] += b * kk[i] * u;
  }
  if (!o) return;
  float qq[KR];
  for (int i = 0; i < KR; ++i) {
    const int64_t x = tl.row(i);
    qq[i] = x < a.K ? a.scale * ld(q, r * a.K + x) : 0.f;
  }
  float ov[kCols];
  for (int c = 0; c < kCols; ++c) {
    float s = 0.f;
    for (int i = 0; i < KR; ++i) s += qq[i] * S[i][c];
    ov[c] = s;
  }
  for (int c = 0; c < kCols; ++c) ov[c] = warp_sum(ov[c]);
  for (int c = 0; c < kCols; ++c)
    if (tl.lane == c && tl.valid[c]) st(o, r * a.V + tl.col[c], ov[c]);
}

template <typename T, int KR>
__global__ void __launch_bounds__(kMaxWarps * 32)
    kda_fwd_kernel(Args a, const T* q, const T* k, const T* v, T* o) {
  const int64_t n = blockIdx.x / a.H, h = blockIdx.x % a.H;
  const Doc d = doc_info(a, n);
  if (!d.ok) return;
  const Tile<KR> tl(a);
  const int64_t KV = a.K * a.V, state = (n * a.H + h) * KV;
  float S[KR][kCols];
  tl.load(S, a.h0 ? a.h0 + state : nullptr, a);
  for (int64_t t = d.t0; t < d.t1; ++t) {
    if ((t - d.t0) % a.seg == 0)
      tl.store(S, a.saved + ((d.row0 + (t - d.t0) / a.seg) * a.H + h) * KV, a);
    fwd_step<T, KR>(S, tl, a, t, h, k, v, q, o);
  }
  if (a.hT) tl.store(S, a.hT + state, a);
}

// Shared memory of the reverse pass, per window token s < W:
//   win[s][cols][32 KR]        the state entering the token (each thread reads back only what it
//                              wrote, so it needs no barrier)
//   part[s][warps][kParts][32 KR]  per-row partials over the warp's columns: S'do, dS delta,
//                              S'ddelta and S'dS' (see below)
//   dot[s][warps]              partial delta . do
size_t bwd_smem_floats(int W, const Split& sp, int KR) {
  const size_t kp = 32 * static_cast<size_t>(KR);
  return static_cast<size_t>(W) *
         (sp.cols * kp + static_cast<size_t>(sp.warps) * kParts * kp + sp.warps);
}

template <typename T, int KR>
__global__ void __launch_bounds__(kMaxWarps * 32)
    kda_bwd_kernel(Args a, const T* q, const T* k, const T* v, const T* dout, T* dq, T* dk, T* dv) {
  extern __shared__ float smem[];
  constexpr int kp = 32 * KR;
  const int warps = blockDim.x >> 5;
  float* win = smem;
  float* part = win + static_cast<size_t>(a.W) * a.cols * kp;
  float* dotp = part + static_cast<size_t>(a.W) * warps * kParts * kp;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), slices = cluster.num_blocks();

  const int64_t n = blockIdx.x / a.H, h = blockIdx.x % a.H;
  const Doc d = doc_info(a, n);  // the same for every block of the cluster
  if (!d.ok) return;
  const Tile<KR> tl(a);
  const int64_t KV = a.K * a.V, state = (n * a.H + h) * KV;
  float dS[KR][kCols];
  tl.load(dS, a.dhT ? a.dhT + state : nullptr, a);

  auto win_at = [&](int64_t s, int i, int c) -> float& {
    return win[(s * a.cols + tl.warp * kCols + c) * kp + tl.row(i)];
  };
  auto part_at = [&](float* base, int64_t s, int w, int p, int64_t x) -> float& {
    return base[((s * warps + w) * kParts + p) * kp + x];
  };

  const int64_t segs = (d.t1 - d.t0 + a.seg - 1) / a.seg;
  for (int64_t sg = segs - 1; sg >= 0; --sg) {
    const int64_t c0 = d.t0 + sg * a.seg, c1 = c0 + a.seg < d.t1 ? c0 + a.seg : d.t1;
    const float* S0 = a.saved + ((d.row0 + sg) * a.H + h) * KV;
    for (int64_t hi = c1; hi > c0; hi -= a.W) {
      const int64_t lo = hi - a.W > c0 ? hi - a.W : c0;
      // States entering tokens lo..hi-1, recomputed from the segment's saved state.
      {
        float S[KR][kCols];
        tl.load(S, S0, a);
        for (int64_t t = c0; t < hi; ++t) {
          if (t >= lo)
            for (int i = 0; i < KR; ++i)
              for (int c = 0; c < kCols; ++c) win_at(t - lo, i, c) = S[i][c];
          if (t + 1 < hi) fwd_step<T, KR>(S, tl, a, t, h, k, v, q, static_cast<T*>(nullptr));
        }
      }
      // Reverse steps. With S' = e^g . S_prev, delta = v - S'^T k and dS the gradient wrt the
      // state leaving the token: dS += scale q do^T; ddelta = beta dS^T k (= dv);
      // dq = scale (S' do + beta k (delta . do)); dk = beta dS delta - S' ddelta;
      // dbeta = k . (dS delta); dS -= k ddelta^T; dg = rowwise S' . dS; dS <- e^g . dS.
      for (int64_t t = hi - 1; t >= lo; --t) {
        const int64_t s = t - lo, r = t * a.H + h;
        float kk[KR], qq[KR], ee[KR];
        for (int i = 0; i < KR; ++i) {
          const int64_t x = tl.row(i);
          kk[i] = x < a.K ? ld(k, r * a.K + x) : 0.f;
          qq[i] = x < a.K ? a.scale * ld(q, r * a.K + x) : 0.f;
          ee[i] = x < a.K ? expf(a.g[r * a.K + x]) : 1.f;
        }
        const float b = a.beta[r];
        float Sp[KR][kCols], dov[kCols], delta[kCols], ddelta[kCols];
        for (int c = 0; c < kCols; ++c) {
          dov[c] = tl.valid[c] ? ld(dout, r * a.V + tl.col[c]) : 0.f;
          float s1 = 0.f, s2 = 0.f;
          for (int i = 0; i < KR; ++i) {
            Sp[i][c] = ee[i] * win_at(s, i, c);
            s1 += kk[i] * Sp[i][c];
            dS[i][c] += qq[i] * dov[c];
            s2 += kk[i] * dS[i][c];
          }
          delta[c] = s1;
          ddelta[c] = s2;
        }
        float dd = 0.f;
        for (int c = 0; c < kCols; ++c) {
          delta[c] = (tl.valid[c] ? ld(v, r * a.V + tl.col[c]) : 0.f) - warp_sum(delta[c]);
          ddelta[c] = b * warp_sum(ddelta[c]);
          dd += delta[c] * dov[c];
          if (tl.lane == c && tl.valid[c]) st(dv, r * a.V + tl.col[c], ddelta[c]);
        }
        if (tl.lane == 0) dotp[s * warps + tl.warp] = dd;
        for (int i = 0; i < KR; ++i) {
          float pa = 0.f, pr = 0.f, px = 0.f, pg = 0.f;
          for (int c = 0; c < kCols; ++c) {
            pa += Sp[i][c] * dov[c];
            pr += dS[i][c] * delta[c];
            px += Sp[i][c] * ddelta[c];
            dS[i][c] -= kk[i] * ddelta[c];
            pg += Sp[i][c] * dS[i][c];
            dS[i][c] *= ee[i];
          }
          const int64_t x = tl.row(i);
          part_at(part, s, tl.warp, 0, x) = pa;
          part_at(part, s, tl.warp, 1, x) = pr;
          part_at(part, s, tl.warp, 2, x) = px;
          part_at(part, s, tl.warp, 3, x) = pg;
        }
      }
      // Every slice's partials of the window are in place: sum them over slices and warps in a
      // fixed order, slice `rank` finishing the tokens s with s % slices == rank.
      cluster.sync();
      for (int64_t s = rank; s < hi - lo; s += slices) {
        const int64_t r = (lo + s) * a.H + h;
        const float b = a.beta[r];
        float dd = 0.f;
        for (unsigned sl = 0; sl < slices; ++sl) {
          const float* rd = cluster.map_shared_rank(dotp, sl);
          for (int w = 0; w < warps; ++w) dd += rd[s * warps + w];
        }
        float kr = 0.f;
        for (int64_t x = threadIdx.x; x < a.K; x += blockDim.x) {
          float sum[kParts] = {0.f, 0.f, 0.f, 0.f};
          for (unsigned sl = 0; sl < slices; ++sl) {
            float* rp = cluster.map_shared_rank(part, sl);
            for (int w = 0; w < warps; ++w)
              for (int p = 0; p < kParts; ++p) sum[p] += part_at(rp, s, w, p, x);
          }
          const float kx = ld(k, r * a.K + x);
          st(dq, r * a.K + x, a.scale * (sum[0] + b * kx * dd));
          st(dk, r * a.K + x, b * sum[1] - sum[2]);
          a.dg[r * a.K + x] = sum[3];
          kr += kx * sum[1];
        }
        kr = block_sum(kr);
        if (threadIdx.x == 0) a.dbeta[r] = kr;
      }
      cluster.sync();  // the next window overwrites what the other slices just read
    }
  }
  if (a.dh0) tl.store(dS, a.dh0 + state, a);
}

int rows_per_lane(int64_t K) {
  return K <= 32 ? 1 : K <= 64 ? 2 : K <= 128 ? 4 : 8;
}

// Runs the statements with `KR` = rows per lane for head_k, a constant.
#define MT_KDA_DISPATCH_KR(K, ...) \
  do {                             \
    switch (rows_per_lane(K)) {    \
      case 1: {                    \
        constexpr int KR = 1;      \
        __VA_ARGS__                \
      } break;                     \
      case 2: {                    \
        constexpr int KR = 2;      \
        __VA_ARGS__                \
      } break;                     \
      case 4: {                    \
        constexpr int KR = 4;      \
        __VA_ARGS__                \
      } break;                     \
      default: {                   \
        constexpr int KR = 8;      \
        __VA_ARGS__                \
      } break;                     \
    }                              \
  } while (0)

void check_dims(const KdaParams& p, const Tensor& cu) {
  MT_CHECK(p.head_k <= kMaxK && p.head_v <= kMaxSlices * kMaxWarps * kCols, ValueError,
           "kda: the CUDA kernel takes head_k and head_v up to 256, got ", p.head_k, " and ",
           p.head_v);
  MT_CHECK(cu.dtype() == DType::I32, ShapeError, "kda: cu_seqlens must be i32, got ",
           dtype_name(cu.dtype()));
}

Args make_args(const KdaParams& p, const Tensor& cu, const Tensor& g, const Tensor& beta,
               const Tensor& saved, const Split& sp) {
  Args a{};
  a.T = p.tokens;
  a.H = p.heads;
  a.K = p.head_k;
  a.V = p.head_v;
  a.N = p.num_seqs;
  a.seg = p.chunked ? p.chunk : 1;
  a.saved_rows = saved.numel() == 0 ? 0 : saved.dim(0);
  a.scale = p.qk_scale();
  a.cols = sp.cols;
  a.W = 1;
  a.cu = ptr<int32_t>(cu);
  a.g = ptr<float>(g);
  a.beta = ptr<float>(beta);
  a.saved = static_cast<float*>(saved.raw());
  return a;
}

const float* opt_in(const Tensor& t) {
  return t.defined() && t.numel() ? ptr<float>(t) : nullptr;
}
// `saved` f32, or bf16 where the tensor-core path keeps the chunk states so (ops/kda_prep_path.h,
// kda_bf16_states_fit: the rule ops/kda.cpp's entries check too).
void expect_saved(const char* op, const KdaParams& p, const Tensor& saved, DType dtype) {
  if (saved.defined() && saved.numel() && saved.dtype() == DType::BF16)
    MT_CHECK(kda_bf16_states_fit(p, dtype), ShapeError, op,
             ": saved is bf16 off the tensor-core path (bf16 q, k, v at chunk 64, head dims 64 or ",
             "128); f32 there");
  else
    expect_f32(op, saved, "saved");
}

float* opt_out(Tensor& t) {
  return t.defined() && t.numel() ? ptr<float>(t) : nullptr;
}

}  // namespace

void kda_forward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                 const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                 const Tensor& h0, Tensor& o, Tensor& hT, Tensor& saved, Tensor& prepared) {
  check_dims(p, cu_seqlens);
  expect_same_dtype("kda", q, k, "k");
  expect_same_dtype("kda", q, v, "v");
  expect_same_dtype("kda", q, o, "o");
  for (const auto& [t, what] :
       {std::pair<const Tensor*, const char*>{&g, "g"}, {&beta, "beta"}, {&h0, "h0"}, {&hT, "hT"}})
    expect_f32("kda", *t, what);
  expect_saved("kda", p, saved, q.dtype());
  if (p.num_seqs == 0) return;
  if (kda_chunk_kernel_fits(p))
    return kda_chunk_forward(ctx, p, cu_seqlens, q, k, v, g, beta, h0, o, hT, saved, prepared);
  const Split sp = split_of(p.head_v);
  Args a = make_args(p, cu_seqlens, g, beta, saved, sp);
  a.h0 = opt_in(h0);
  a.hT = opt_out(hT);
  const dim3 grid(static_cast<unsigned>(p.num_seqs * p.heads), sp.slices);
  MT_DISPATCH_FLOAT(q, "kda", {
    MT_KDA_DISPATCH_KR(p.head_k, {
      kda_fwd_kernel<T, KR>
          <<<grid, sp.warps * 32, 0, stream(ctx)>>>(a, ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(o));
    });
  });
  MT_CUDA_LAUNCH_CHECK();
}

void kda_backward(Context& ctx, const KdaParams& p, const Tensor& cu_seqlens, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const Tensor& saved, Tensor& prepared, const Tensor& dout, const Tensor& dhT,
                  Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta, Tensor& dh0) {
  check_dims(p, cu_seqlens);
  expect_same_dtype("kda", q, k, "k");
  expect_same_dtype("kda", q, v, "v");
  expect_same_dtype("kda", q, dout, "dout");
  expect_same_dtype("kda", q, dq, "dq");
  expect_same_dtype("kda", q, dk, "dk");
  expect_same_dtype("kda", q, dv, "dv");
  for (const auto& [t, what] : {std::pair<const Tensor*, const char*>{&g, "g"},
                                {&beta, "beta"},
                                {&dhT, "dhT"},
                                {&dg, "dg"},
                                {&dbeta, "dbeta"},
                                {&dh0, "dh0"}})
    expect_f32("kda", *t, what);
  expect_saved("kda", p, saved, q.dtype());
  if (p.num_seqs == 0) return;
  if (kda_chunk_kernel_fits(p))
    return kda_chunk_backward(ctx, p, cu_seqlens, q, k, v, g, beta, saved, prepared, dout, dhT, dq,
                              dk, dv, dg, dbeta, dh0);
  const Split sp = split_of(p.head_v);
  Args a = make_args(p, cu_seqlens, g, beta, saved, sp);
  a.dhT = opt_in(dhT);
  a.dh0 = opt_out(dh0);
  a.dg = opt_out(dg);
  a.dbeta = opt_out(dbeta);
  const int KRv = rows_per_lane(p.head_k);
  // As many window tokens as the budget holds (at least one; at most a segment).
  const size_t per_token = bwd_smem_floats(1, sp, KRv) * sizeof(float);
  a.W = static_cast<int>(
      std::clamp<int64_t>(static_cast<int64_t>(kSmemBudget / per_token), 1, a.seg));
  const size_t smem = bwd_smem_floats(a.W, sp, KRv) * sizeof(float);

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(p.num_seqs * p.heads), sp.slices);
  cfg.blockDim = dim3(sp.warps * 32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream(ctx);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(sp.slices);
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MT_DISPATCH_FLOAT(q, "kda", {
    MT_KDA_DISPATCH_KR(p.head_k, {
      auto kernel = kda_bwd_kernel<T, KR>;
      MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
      MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, ptr<T>(q), ptr<T>(k), ptr<T>(v),
                                       ptr<T>(dout), ptr<T>(dq), ptr<T>(dk), ptr<T>(dv)));
    });
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
