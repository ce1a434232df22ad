#include "ops/grouped_matmul.h"

#include "ops/dispatch.h"
#include "ops/gemm.h"

namespace mt::ops {

namespace {

// bf16 weights are for the GPU path; the CPU path computes on f32 storage.
bool gpu_bf16(const Tensor& t) {
  return t.device() != Device::CPU && t.dtype() == DType::BF16;
}

}  // namespace

void expect_group_offsets(const Tensor& offsets, int64_t groups, int64_t rows, const char* op) {
  expect_shape(offsets, {groups + 1}, op);
  MT_CHECK(offsets.dtype() == DType::I32 && offsets.device() == Device::CPU, ValueError, op,
           ": group offsets must be a host i32 tensor, got ", dtype_name(offsets.dtype()), " on ",
           device_name(offsets.device()));
  const int32_t* off = offsets.i32();
  MT_CHECK(off[0] == 0 && off[groups] == rows, ValueError, op, ": group offsets span [", off[0],
           ", ", off[groups], "), expected [0, ", rows, ")");
  for (int64_t g = 0; g < groups; ++g)
    MT_CHECK(off[g] <= off[g + 1], ValueError, op, ": group offsets decrease at group ", g);
}

void grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                    const Tensor& offsets, const Tensor& b, Tensor& c) {
  const bool dw = p.form == GroupedForm::DytX;
  const Tensor& w = dw ? c : b;
  MT_CHECK(w.ndim() == 3 && (w.dtype() == DType::F32 || (!dw && gpu_bf16(w))), ShapeError,
           "grouped_matmul: ", dw ? "dW" : "W", " must be an f32 [groups, out, in] tensor, got ",
           w.shape());
  const int64_t G = w.dim(0), out = w.dim(1), in = w.dim(2), N = a.dim(0);
  expect_shape(w, {G, out, in}, dw ? "grouped_matmul dW" : "grouped_matmul W");
  expect_matrix(a, "grouped_matmul", "A");
  const Tensor& rows_out = dw ? b : c;  // the other [N, *] operand
  expect_matrix(rows_out, "grouped_matmul", dw ? "X" : "C");
  switch (p.form) {
    case GroupedForm::XWt:
      expect_dims(a, {N, in}, "grouped_matmul X");
      expect_dims(c, {N, out}, "grouped_matmul Y");
      break;
    case GroupedForm::DyW:
      expect_dims(a, {N, out}, "grouped_matmul dY");
      expect_dims(c, {N, in}, "grouped_matmul dX");
      break;
    case GroupedForm::DytX:
      expect_dims(a, {N, out}, "grouped_matmul dY");
      expect_dims(b, {N, in}, "grouped_matmul X");
      break;
  }
  expect_group_offsets(offsets, G, N, "grouped_matmul offsets");
  MT_CHECK(a.device() == w.device() && rows_out.device() == w.device(), ValueError,
           "grouped_matmul operands on ", device_name(a.device()), ", ", device_name(b.device()),
           ", ", device_name(c.device()));
  // The offsets stay on the host (they drive the per-group launches); the operands pick the path.
  dispatch(MT_OP_BODIES(grouped_matmul), {&a, &b, &c}, ctx, p, a, offsets, b, c);
}

}  // namespace mt::ops
