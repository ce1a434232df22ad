#include "ops/row_scatter.h"

#include <vector>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check(const RowScatterParams& p, const Tensor& index, const Tensor& src, const Tensor& dst,
           const char* sn, const char* dn) {
  MT_CHECK(p.rows >= 0 && p.dst_rows >= 0 && p.dim > 0, ValueError, "row_scatter: bad params rows ",
           p.rows, " dst_rows ", p.dst_rows, " dim ", p.dim);
  expect_shape(index, {p.rows}, "row_scatter index");
  MT_CHECK(index.dtype() == DType::I32, ShapeError, "row_scatter index must be i32, got ",
           dtype_name(index.dtype()));
  expect_shape(src, {p.rows, p.dim}, sn);
  expect_shape(dst, {p.dst_rows, p.dim}, dn);
}

}  // namespace

void check_row_index(const RowScatterParams& p, const Tensor& index, const char* what,
                     const char* unit) {
  std::vector<char> seen(static_cast<size_t>(p.dst_rows), 0);
  const int32_t* ix = index.i32();
  for (int64_t k = 0; k < p.rows; ++k) {
    MT_CHECK(ix[k] >= 0 && ix[k] < p.dst_rows && !seen[static_cast<size_t>(ix[k])], ValueError,
             what, "[", k, "] = ", ix[k], " is out of range or repeated (", p.dst_rows, " ", unit,
             ")");
    seen[static_cast<size_t>(ix[k])] = 1;
  }
}

void row_scatter_forward(Context& ctx, const RowScatterParams& p, const Tensor& index,
                         const Tensor& src, Tensor& dst) {
  check(p, index, src, dst, "row_scatter src", "row_scatter dst");
  if (auto* cuda = cuda_body(MT_OP_BODIES(row_scatter_forward), {&index, &src, &dst}))
    return cuda(ctx, p, index, src, dst);
  check_row_index(p, index, "row_scatter index", "rows");
  cpu::row_scatter_forward(ctx, p, index, src, dst);
}

void row_scatter_backward(Context& ctx, const RowScatterParams& p, const Tensor& index,
                          Tensor& ddst, Tensor& dsrc) {
  check(p, index, dsrc, ddst, "row_scatter dsrc", "row_scatter ddst");
  if (auto* cuda = cuda_body(MT_OP_BODIES(row_scatter_backward), {&index, &ddst, &dsrc}))
    return cuda(ctx, p, index, ddst, dsrc);
  check_row_index(p, index, "row_scatter index", "rows");
  cpu::row_scatter_backward(ctx, p, index, ddst, dsrc);
}

}  // namespace mt::ops
