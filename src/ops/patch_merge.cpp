#include "ops/patch_merge.h"

#include <vector>

#include "ops/dispatch.h"
#include "ops/row_scatter.h"

namespace mt::ops {

namespace {

void check(const PatchMergeParams& p, const Tensor& order, const Tensor& a, const Tensor& b,
           const char* an, const char* bn) {
  MT_CHECK(p.patches >= 0 && p.dim > 0, ValueError, "patch_merge: bad params patches ", p.patches,
           " dim ", p.dim);
  expect_shape(order, {p.patches}, "patch_merge order");
  MT_CHECK(order.dtype() == DType::I32, ShapeError, "patch_merge order must be i32, got ",
           dtype_name(order.dtype()));
  expect_shape(a, {p.patches, p.dim}, an);
  expect_shape(b, {p.patches, p.dim}, bn);
}

// The permutation `order` as row_scatter's index: patches entries into as many rows. A repeated
// or out-of-range entry would leave rows unwritten (backward) or read twice.
RowScatterParams as_scatter(const PatchMergeParams& p) {
  return {.rows = p.patches, .dst_rows = p.patches, .dim = p.dim};
}

void check_permutation(const PatchMergeParams& p, const Tensor& order) {
  check_row_index(as_scatter(p), order, "patch_merge order", "patches");
}

}  // namespace

void patch_merge_forward(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                         const Tensor& x, Tensor& y) {
  check(p, order, x, y, "patch_merge x", "patch_merge y");
  if (auto* cuda = cuda_body(MT_OP_BODIES(patch_merge_forward), {&order, &x, &y}))
    return cuda(ctx, p, order, x, y);
  check_permutation(p, order);
  cpu::patch_merge_forward(ctx, p, order, x, y);
}

void patch_merge_backward(Context& ctx, const PatchMergeParams& p, const Tensor& order,
                          const Tensor& dy, Tensor& dx) {
  check(p, order, dy, dx, "patch_merge dy", "patch_merge dx");
  // dx[order[s]] = dy[s]: row_scatter's forward body.
  const auto op = MT_NAMED_OP_BODIES("patch_merge_backward", row_scatter_forward);
  if (auto* cuda = cuda_body(op, {&order, &dy, &dx}))
    return cuda(ctx, as_scatter(p), order, dy, dx);
  check_permutation(p, order);
  op.cpu(ctx, as_scatter(p), order, dy, dx);
}

}  // namespace mt::ops
