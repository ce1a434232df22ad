// The KDA decay gate on the GPU: g = -exp(A_log[h]) * softplus(raw + dt_bias), in fp32 (g is the
// log-decay that the KDA core sums over a chunk, so it stays f32 whatever raw's type).
//
// Both passes are bound by HBM. A thread owns one pack of V channels (16 bytes of raw) and walks
// rows, so dt_bias and exp(A_log) are read once per thread and no index is divided per element.
// Backward is one pass: it writes draw and leaves per-(row chunk, channel) partial sums of draw
// (for dt_bias) and per-(row chunk, pack) sums of dg * g (for A_log) in the workspace;
// colsum_accumulate adds them over the chunks in a fixed order (deterministic, no atomics). The
// row chunks depend only on the shapes.
#include <algorithm>

#include "core/arena.h"
#include "ops/cuda/colsum.cuh"
#include "ops/cuda/common.cuh"
#include "ops/kda_gate.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// softplus with beta 1 and threshold 20 (as torch / fla), and its derivative (exactly 1 where it is
// the identity).
__device__ __forceinline__ float softplus(float x) {
  return x > 20.f ? x : log1pf(expf(x));
}
__device__ __forceinline__ float softplus_grad(float x) {
  return x > 20.f ? 1.f : 1.f / (1.f + expf(-x));
}
// Backward's row chunks: at least kMinRows rows each, at most kMaxChunks of them (the partials'
// size), so that a step's shapes give a grid of about a thousand blocks.
constexpr int64_t kMinRows = 16, kMaxChunks = 512;
// Forward's grid rows: enough blocks to fill the GPU several times over.
constexpr int64_t kFwdRowBlocks = 1024;

// V consecutive elements as floats (16-byte accesses where V packs 16 bytes).
template <typename T, int V>
__device__ __forceinline__ void load_v(const T* p, float (&o)[V]) {
  if constexpr (V == 1) {
    o[0] = ld(p, 0);
  } else if constexpr (sizeof(T) * V == 16) {
    const Pack<T, V> x = load_pack<T, V>(p);
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = ld(x.v, j);
  } else {
    static_assert(std::is_same_v<T, float> && V % 4 == 0, "fp32 packs of four");
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const Pack<float, 4> x = load_pack<float, 4>(p + j);
#pragma unroll
      for (int u = 0; u < 4; ++u) o[j + u] = x.v[u];
    }
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_v(T* p, const float (&o)[V]) {
  if constexpr (V == 1) {
    st(p, 0, o[0]);
  } else if constexpr (sizeof(T) * V == 16) {
    Pack<T, V> x;
#pragma unroll
    for (int j = 0; j < V; ++j) st(x.v, j, o[j]);
    store_pack<T, V>(p, x);
  } else {
    static_assert(std::is_same_v<T, float> && V % 4 == 0, "fp32 packs of four");
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      Pack<float, 4> x;
#pragma unroll
      for (int u = 0; u < 4; ++u) x.v[u] = o[j + u];
      store_pack<float, 4>(p + j, x);
    }
  }
}

// Grid: x over packs of a row, y strides over rows. K % V == 0: a pack lies in one head.
template <typename T, int V>
__global__ void gate_fwd_kernel(int64_t rows, int64_t HK, int K, const T* raw, const float* a_log,
                                const float* dt_bias, float* g) {
  const int64_t c0 = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * V;
  if (c0 >= HK) return;
  const float a = expf(a_log[c0 / K]);
  float db[V];
  load_v<float, V>(dt_bias + c0, db);
#pragma unroll 4
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float x[V];
    load_v<T, V>(raw + r * HK + c0, x);
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] = -a * softplus(x[j] + db[j]);
    store_v<float, V>(g + r * HK + c0, x);
  }
}

// Grid: x over packs of a row, y = the row chunk. part_dt [chunks][HK], part_a [chunks][HK / V]
// (each null where that gradient is not wanted).
template <typename T, int V>
__global__ void gate_bwd_kernel(int64_t rows, int64_t HK, int K, int64_t per_chunk, const T* raw,
                                const float* a_log, const float* dt_bias, const float* dg, T* draw,
                                float* part_dt, float* part_a) {
  const int64_t pk = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, c0 = pk * V;
  if (c0 >= HK) return;
  const float a = expf(a_log[c0 / K]);
  float db[V], sdt[V], sa = 0.f;
  load_v<float, V>(dt_bias + c0, db);
#pragma unroll
  for (int j = 0; j < V; ++j) sdt[j] = 0.f;
  const int64_t r0 = blockIdx.y * per_chunk, r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
#pragma unroll 2
  for (int64_t r = r0; r < r1; ++r) {
    float x[V], d[V];
    load_v<T, V>(raw + r * HK + c0, x);
    load_v<float, V>(dg + r * HK + c0, d);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float u = x[j] + db[j];
      sa += d[j] * -a * softplus(u);  // dg/dA_log is g itself
      x[j] = -a * softplus_grad(u) * d[j];
      sdt[j] += x[j];
    }
    store_v<T, V>(draw + r * HK + c0, x);
  }
  if (part_dt) store_v<float, V>(part_dt + blockIdx.y * HK + c0, sdt);
  if (part_a) part_a[blockIdx.y * (HK / V) + pk] = sa;
}

int64_t gate_chunks(int64_t rows) {
  return std::clamp<int64_t>((rows + kMinRows - 1) / kMinRows, 1, kMaxChunks);
}

}  // namespace

void kda_gate_forward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                      const Tensor& dt_bias, Tensor& g) {
  expect_f32("kda_gate", a_log, "A_log");
  expect_f32("kda_gate", dt_bias, "dt_bias");
  expect_f32("kda_gate", g, "g");
  const int64_t HK = p.heads * p.head_dim, K = p.head_dim;
  if (p.tokens == 0) return;
  MT_DISPATCH_FLOAT(raw, "kda_gate", {
    constexpr int kPack = 16 / sizeof(T);
    const bool packed = K % kPack == 0 && packs_fit<T>(HK, {raw.raw()}) &&
                        packs_fit<float>(HK, {g.raw(), dt_bias.raw()});
    with_pack<T>(packed, [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const dim3 grid(blocks_for(HK / V, kThreads),
                      static_cast<unsigned>(std::min(p.tokens, kFwdRowBlocks)));
      gate_fwd_kernel<T, V><<<grid, kThreads, 0, stream(ctx)>>>(p.tokens, HK, static_cast<int>(K),
                                                                ptr<T>(raw), ptr<float>(a_log),
                                                                ptr<float>(dt_bias), ptr<float>(g));
    });
  });
  MT_CUDA_LAUNCH_CHECK();
}

void kda_gate_backward(Context& ctx, const KdaGateParams& p, const Tensor& raw, const Tensor& a_log,
                       const Tensor& dt_bias, const Tensor& dg, Tensor& draw, Tensor& da_log,
                       Tensor& ddt_bias) {
  expect_f32("kda_gate", dg, "dg");
  expect_same_dtype("kda_gate", raw, draw, "draw");
  expect_f32("kda_gate", da_log, "A_log gradient");
  expect_f32("kda_gate", ddt_bias, "dt_bias gradient");
  const int64_t HK = p.heads * p.head_dim, K = p.head_dim;
  if (p.tokens == 0) return;
  const bool want_dt = ddt_bias.defined() && ddt_bias.numel(),
             want_a = da_log.defined() && da_log.numel();
  const int64_t chunks = gate_chunks(p.tokens), per_chunk = (p.tokens + chunks - 1) / chunks;
  ArenaScope scope(ctx.workspace());
  // part_dt [chunks][HK] (16-byte aligned rows where packed: HK is a multiple of the pack), then
  // part_a [chunks][HK / pack].
  float *part_dt = nullptr, *part_a = nullptr;
  int64_t packs_per_head = 0;
  MT_DISPATCH_FLOAT(raw, "kda_gate", {
    constexpr int kPack = 16 / sizeof(T);
    const bool packed = K % kPack == 0 && packs_fit<T>(HK, {raw.raw(), draw.raw()}) &&
                        packs_fit<float>(HK, {dg.raw(), dt_bias.raw()});
    with_pack<T>(packed, [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const int64_t npacks = HK / V;
      packs_per_head = K / V;
      Tensor part = ctx.workspace().alloc({chunks * (HK + npacks)});
      part_dt = want_dt ? ptr<float>(part) : nullptr;
      part_a = want_a ? ptr<float>(part) + chunks * HK : nullptr;
      const dim3 grid(blocks_for(npacks, kThreads), static_cast<unsigned>(chunks));
      gate_bwd_kernel<T, V><<<grid, kThreads, 0, stream(ctx)>>>(
          p.tokens, HK, static_cast<int>(K), per_chunk, ptr<T>(raw), ptr<float>(a_log),
          ptr<float>(dt_bias), ptr<float>(dg), ptr<T>(draw), part_dt, part_a);
      MT_CUDA_LAUNCH_CHECK();
    });
  });
  // The chunks' partials added in a fixed order (parameter gradients accumulate): dt_bias per
  // channel, A_log per head over its packs.
  if (part_dt) {
    const float* pd = part_dt;
    colsum_accumulate(ctx, chunks, HK, ptr<float>(ddt_bias),
                      [=] __device__(int64_t r, int64_t c) { return pd[r * HK + c]; });
  }
  if (part_a) {
    const float* pa = part_a;
    const int64_t pph = packs_per_head, npacks = p.heads * pph;
    colsum_accumulate(ctx, chunks, p.heads, ptr<float>(da_log),
                      [=] __device__(int64_t r, int64_t h) {
                        float s = 0.f;
                        for (int64_t j = 0; j < pph; ++j) s += pa[r * npacks + h * pph + j];
                        return s;
                      });
  }
}

}  // namespace mt::ops::cuda
