// Interpolated position embeddings on the GPU. Forward: one thread per (patch, column), the taps'
// weighted table rows added to x (y may alias x). Backward: many patches share a table row, so
// the tap table is transposed on the device (index_lists.cuh: every table row's slots
// n * taps + k in increasing order) and one thread per (table row, column) sums its slots in
// patch order: one writer per element, no float atomics, bit-repeatable. Taps outside the table
// are skipped (the entry checks them only on the host path, which may read idx).
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/index_lists.cuh"
#include "ops/pos_embed.h"

namespace mt::ops::cuda {

namespace {

template <typename T>
__global__ void pos_embed_bwd_kernel(int64_t rows, int64_t D, int64_t K, DeviceKeyLists lists,
                                     const float* wts, const T* dy, float* dtable) {
  const int64_t r = blockIdx.x;
  const int32_t e0 = lists.offsets[r], e1 = lists.offsets[r + 1];
  for (int64_t d = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; d < D;
       d += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float s = 0.f;
    for (int32_t e = e0; e < e1; ++e) {
      const int32_t slot = lists.entries[e];
      s += wts[slot] * ld(dy, (slot / K) * D + d);
    }
    dtable[r * D + d] += s;  // a parameter gradient: accumulates
  }
}

}  // namespace

void pos_embed_forward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                       const Tensor& table, const Tensor& x, Tensor& y) {
  expect_f32("pos_embed", wts, "wts");
  expect_same_dtype("pos_embed", x, table, "table");
  expect_same_dtype("pos_embed", x, y, "y");
  const int64_t D = p.dim, K = p.taps(), rows = p.table_rows * p.table_cols;
  const int32_t* pi = ptr<int32_t>(idx);
  const float* pw = ptr<float>(wts);
  MT_DISPATCH_FLOAT(x, "pos_embed", {
    const T* tab = ptr<T>(table);
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    for_each_index(ctx, p.patches * D, [=] __device__(int64_t i) {
      const int64_t n = i / D, d = i % D;
      float v = ld(px, i);
      for (int64_t k = 0; k < K; ++k) {
        const int32_t r = pi[n * K + k];
        if (r >= 0 && r < rows) v += pw[n * K + k] * ld(tab, static_cast<int64_t>(r) * D + d);
      }
      st(py, i, v);
    });
  });
}

void pos_embed_backward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                        const Tensor& dy, Tensor& dtable) {
  expect_f32("pos_embed", wts, "wts");
  expect_f32("pos_embed", dtable, "dtable");
  const int64_t D = p.dim, K = p.taps(), rows = p.table_rows * p.table_cols;
  if (p.patches == 0) return;
  ArenaScope scope(ctx.workspace());
  const DeviceKeyLists lists =
      build_device_slot_lists(ctx, ptr<int32_t>(idx), p.patches * K, rows, "pos_embed");
  constexpr int threads = 128;
  const int64_t col_blocks = (D + threads - 1) / threads;
  const dim3 grid(grid_of(rows, "pos_embed"),
                  static_cast<unsigned>(std::min<int64_t>(col_blocks, 65535)));
  MT_DISPATCH_FLOAT(dy, "pos_embed", {
    pos_embed_bwd_kernel<T><<<grid, threads, 0, stream(ctx)>>>(rows, D, K, lists, ptr<float>(wts),
                                                               ptr<T>(dy), ptr<float>(dtable));
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
