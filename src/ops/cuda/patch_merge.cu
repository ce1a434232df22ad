// The spatial patch merge on the GPU: a row gather, one thread per element (its backward, a
// scatter, is row_scatter.cu's forward). The entry checks that `order` is a permutation only on
// the host path (it would have to read device memory); here an entry out of range is skipped, so
// a bad order leaves rows unwritten rather than touching memory outside the tensors.
#include "ops/cuda/common.cuh"
#include "ops/patch_merge.h"

namespace mt::ops::cuda {

void patch_merge_forward(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                         const Tensor& x, Tensor& y) {
  expect_same_dtype("patch_merge", x, y, "y");
  const int64_t D = p.dim, N = p.patches;
  const int32_t* o = ptr<int32_t>(order);
  MT_DISPATCH_FLOAT(x, "patch_merge", {
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    for_each_index(ctx, N * D, [=] __device__(int64_t i) {
      const int64_t s = i / D, src = o[s];
      if (src >= 0 && src < N) py[i] = px[src * D + i % D];
    });
  });
}

}  // namespace mt::ops::cuda
