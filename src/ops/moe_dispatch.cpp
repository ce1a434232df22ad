#include "ops/moe_dispatch.h"

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_rows(const Tensor& rows, const Tensor& index, const char* what) {
  MT_CHECK(rows.ndim() == 2 && index.ndim() == 1 && rows.dim(0) == index.dim(0), ShapeError, what,
           ": rows ", rows.shape(), " vs index ", index.shape());
}

}  // namespace

void moe_dispatch_plan(Context& ctx, const Tensor& ids, int64_t experts, Tensor& perm, Tensor& inv,
                       Tensor& offsets) {
  MT_CHECK(ids.ndim() == 2, ShapeError, "expert ids must be [T,k], got ", ids.shape());
  expect_shape(perm, {ids.numel()}, "dispatch perm");
  expect_shape(inv, {ids.numel()}, "dispatch inv");
  expect_shape(offsets, {experts + 1}, "dispatch offsets");
  if (auto* cuda = cuda_body(MT_OP_BODIES(moe_dispatch_plan), {&ids, &perm, &inv, &offsets}))
    return cuda(ctx, ids, experts, perm, inv, offsets);
  // Reads the ids, so only on the host path.
  const int32_t* pid = ids.i32();
  for (int64_t s = 0; s < ids.numel(); ++s)
    MT_CHECK(pid[s] >= 0 && pid[s] < experts, ValueError, "expert id ", pid[s], " at slot ", s,
             " out of [0, ", experts, ")");
  cpu::moe_dispatch_plan(ctx, ids, experts, perm, inv, offsets);
}

void moe_gather(Context& ctx, const Tensor& x, const Tensor& perm, int64_t top_k, Tensor& rows) {
  check_rows(rows, perm, "moe_gather");
  MT_CHECK(x.ndim() == 2 && x.dim(1) == rows.dim(1) && x.dim(0) * top_k == rows.dim(0), ShapeError,
           "moe_gather: x ", x.shape(), " with k ", top_k, " -> rows ", rows.shape());
  dispatch(MT_OP_BODIES(moe_gather), {&x, &perm, &rows}, ctx, x, perm, top_k, rows);
}

void moe_gather_backward(Context& ctx, const Tensor& drows, const Tensor& inv, int64_t top_k,
                         Tensor& dx, bool accumulate) {
  check_rows(drows, inv, "moe_gather backward");
  MT_CHECK(dx.ndim() == 2 && dx.dim(1) == drows.dim(1) && dx.dim(0) * top_k == drows.dim(0),
           ShapeError, "moe_gather backward: dx ", dx.shape(), " with k ", top_k, " <- drows ",
           drows.shape());
  dispatch(MT_OP_BODIES(moe_gather_backward), {&drows, &inv, &dx}, ctx, drows, inv, top_k, dx,
           accumulate);
}

void moe_combine(Context& ctx, const Tensor& rows, const Tensor& weights, const Tensor& inv,
                 Tensor& y) {
  check_rows(rows, inv, "moe_combine");
  MT_CHECK(weights.ndim() == 2 && y.ndim() == 2 && weights.dim(0) == y.dim(0) &&
               weights.numel() == rows.dim(0) && y.dim(1) == rows.dim(1),
           ShapeError, "moe_combine: rows ", rows.shape(), ", weights ", weights.shape(), " -> y ",
           y.shape());
  dispatch(MT_OP_BODIES(moe_combine), {&rows, &weights, &inv, &y}, ctx, rows, weights, inv, y);
}

void moe_combine_backward(Context& ctx, const Tensor& rows, const Tensor& weights,
                          const Tensor& inv, const Tensor& dy, Tensor& drows, Tensor& dweights) {
  check_rows(rows, inv, "moe_combine backward");
  expect_dims(drows, rows.shape(), "moe_combine drows");  // a GPU's may be row-pitched
  expect_shape(dweights, weights.shape(), "moe_combine dweights");
  MT_CHECK(weights.ndim() == 2 && dy.ndim() == 2 && weights.dim(0) == dy.dim(0) &&
               weights.numel() == rows.dim(0) && dy.dim(1) == rows.dim(1),
           ShapeError, "moe_combine backward: rows ", rows.shape(), ", weights ", weights.shape(),
           ", dy ", dy.shape());
  dispatch(MT_OP_BODIES(moe_combine_backward), {&rows, &weights, &inv, &dy, &drows, &dweights}, ctx,
           rows, weights, inv, dy, drows, dweights);
}

}  // namespace mt::ops
