// The row scatter on the GPU: one thread per element of the scattered rows. Entries are distinct
// (the host path checks it), so every element has one writer; an entry out of range is skipped.
#include "ops/cuda/common.cuh"
#include "ops/row_scatter.h"

namespace mt::ops::cuda {

void row_scatter_forward(Context& ctx, const RowScatterParams& p, const Tensor& index,
                         const Tensor& src, Tensor& dst) {
  expect_same_dtype("row_scatter", src, dst, "dst");
  const int64_t D = p.dim, N = p.dst_rows;
  const int32_t* ix = ptr<int32_t>(index);
  MT_DISPATCH_FLOAT(src, "row_scatter", {
    const T* ps = ptr<T>(src);
    T* pd = ptr<T>(dst);
    for_each_index(ctx, p.rows * D, [=] __device__(int64_t i) {
      const int64_t r = ix[i / D];
      if (r >= 0 && r < N) pd[r * D + i % D] = ps[i];
    });
  });
}

void row_scatter_backward(Context& ctx, const RowScatterParams& p, const Tensor& index,
                          Tensor& ddst, Tensor& dsrc) {
  expect_same_dtype("row_scatter", ddst, dsrc, "dsrc");
  const int64_t D = p.dim, N = p.dst_rows;
  const int32_t* ix = ptr<int32_t>(index);
  MT_DISPATCH_FLOAT(ddst, "row_scatter", {
    T* pd = ptr<T>(ddst);
    T* ps = ptr<T>(dsrc);
    for_each_index(ctx, p.rows * D, [=] __device__(int64_t i) {
      const int64_t r = ix[i / D];
      if (r < 0 || r >= N) return;
      const int64_t e = r * D + i % D;
      ps[i] = pd[e];
      st(pd, e, 0.f);
    });
  });
}

}  // namespace mt::ops::cuda
