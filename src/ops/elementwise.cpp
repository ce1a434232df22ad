#include "ops/elementwise.h"

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

// f32 everywhere; bf16 too on the GPU (the CPU bodies refuse it through their typed access).
void same_f32(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  const bool gpu = a.device() == Device::CUDA;
  const bool ok =
      a.dtype() == b.dtype() && (a.dtype() == DType::F32 || (gpu && a.dtype() == DType::BF16));
  MT_CHECK(ok, ShapeError, op, ": ", na, " and ", nb, " must be f32", gpu ? " or bf16" : "",
           ", got ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  MT_CHECK(a.device() == b.device(), ValueError, op, ": ", na, " on ", device_name(a.device()),
           ", ", nb, " on ", device_name(b.device()));
}

}  // namespace

void add_into(Context& ctx, const Tensor& x, Tensor& acc) {
  same_f32(x, acc, "add_into", "x", "acc");
  expect_shape(x, acc.shape(), "add_into x");
  expect_shape(acc, x.shape(), "add_into acc");
  dispatch(MT_OP_BODIES(add_into), {&x, &acc}, ctx, x, acc);
}

void scale(Context& ctx, const Tensor& x, float s, Tensor& y) {
  same_f32(x, y, "scale", "x", "y");
  expect_shape(x, y.shape(), "scale x");
  expect_shape(y, x.shape(), "scale y");
  dispatch(MT_OP_BODIES(scale), {&x, &y}, ctx, x, s, y);
}

void sigmoid_forward(Context& ctx, const Tensor& x, Tensor& y) {
  same_f32(x, y, "sigmoid_forward", "x", "y");
  expect_shape(x, y.shape(), "sigmoid x");
  expect_shape(y, x.shape(), "sigmoid y");
  dispatch(MT_OP_BODIES(sigmoid_forward), {&x, &y}, ctx, x, y);
}

void sigmoid_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  same_f32(y, dy, "sigmoid_backward", "y", "dy");
  same_f32(y, dx, "sigmoid_backward", "y", "dx");
  expect_shape(y, dx.shape(), "sigmoid y");
  expect_shape(dy, dx.shape(), "sigmoid dy");
  expect_shape(dx, y.shape(), "sigmoid dx");
  dispatch(MT_OP_BODIES(sigmoid_backward), {&y, &dy, &dx}, ctx, y, dy, dx);
}

void copy(Context& ctx, const Tensor& src, Tensor& dst) {
  const auto fp = [](DType t) { return t == DType::F32 || t == DType::BF16; };
  MT_CHECK(src.dtype() == dst.dtype() || (fp(src.dtype()) && fp(dst.dtype())), ShapeError,
           "copy: ", dtype_name(src.dtype()), " into ", dtype_name(dst.dtype()));
  MT_CHECK(src.device() == dst.device(), ValueError, "copy: ", device_name(src.device()), " into ",
           device_name(dst.device()));
  expect_dims(src, dst.shape(), "copy src");
  dispatch(MT_OP_BODIES(copy), {&src, &dst}, ctx, src, dst);
}

void expand_heads_forward(Context& ctx, const Tensor& x, Tensor& y) {
  same_f32(x, y, "expand_heads_forward", "x", "y");
  MT_CHECK(y.ndim() == 3, ShapeError, "expand_heads y has shape ", y.shape(),
           ", expected [T, heads, D]");
  expect_dims(x, {y.dim(0), y.dim(2)}, "expand_heads x");
  dispatch(MT_OP_BODIES(expand_heads_forward), {&x, &y}, ctx, x, y);
}

void expand_heads_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  same_f32(dy, dx, "expand_heads_backward", "dy", "dx");
  MT_CHECK(dy.ndim() == 3, ShapeError, "expand_heads dy has shape ", dy.shape(),
           ", expected [T, heads, D]");
  expect_dims(dx, {dy.dim(0), dy.dim(2)}, "expand_heads dx");
  dispatch(MT_OP_BODIES(expand_heads_backward), {&dy, &dx}, ctx, dy, dx);
}

}  // namespace mt::ops
