#include "ops/patch_merge.h"

#include <vector>

#include "ops/dispatch.h"

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

// A repeated or out-of-range entry would leave rows unwritten (backward) or read twice.
void check_permutation(const PatchMergeParams& p, const Tensor& order) {
  std::vector<char> seen(static_cast<size_t>(p.patches), 0);
  const int32_t* o = order.i32();
  for (int64_t s = 0; s < p.patches; ++s) {
    MT_CHECK(o[s] >= 0 && o[s] < p.patches && !seen[static_cast<size_t>(o[s])], ValueError,
             "patch_merge order[", s, "] = ", o[s], " is out of range or repeated (", p.patches,
             " patches)");
    seen[static_cast<size_t>(o[s])] = 1;
  }
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
  if (auto* cuda = cuda_body(MT_OP_BODIES(patch_merge_backward), {&order, &dy, &dx}))
    return cuda(ctx, p, order, dy, dx);
  check_permutation(p, order);
  cpu::patch_merge_backward(ctx, p, order, dy, dx);
}

}  // namespace mt::ops
