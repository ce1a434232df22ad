#include "ops/conv1d.h"

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_shapes(const CausalConvParams& p, const Tensor& cu_seqlens, const Tensor& x,
                  const Tensor& w) {
  MT_CHECK(p.kernel > 0 && p.channels > 0 && p.tokens >= 0, ValueError,
           "causal_conv1d: bad sizes tokens=", p.tokens, " channels=", p.channels,
           " kernel=", p.kernel);
  MT_CHECK(cu_seqlens.ndim() == 1 && cu_seqlens.dim(0) >= 1, ShapeError,
           "causal_conv1d cu_seqlens has shape ", cu_seqlens.shape(), ", expected [N+1]");
  expect_shape(x, {p.tokens, p.channels}, "causal_conv1d x");
  expect_shape(w, {p.channels, p.kernel}, "causal_conv1d weight");
}

// Reads the offsets, so it runs on the host path only: a device path takes them from SeqInfo's
// host copy instead of synchronising to check.
void check_offsets(const CausalConvParams& p, const Tensor& cu_seqlens) {
  const int32_t* cu = cu_seqlens.i32();
  const int64_t n = cu_seqlens.dim(0) - 1;
  MT_CHECK(cu[0] == 0 && cu[n] == p.tokens, ValueError, "causal_conv1d: cu_seqlens spans [", cu[0],
           ", ", cu[n], "), expected [0, ", p.tokens, ")");
  for (int64_t i = 0; i < n; ++i)
    MT_CHECK(cu[i] <= cu[i + 1], ValueError, "causal_conv1d: cu_seqlens decreases at ", i);
}

}  // namespace

void causal_conv1d_forward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                           const Tensor& x, const Tensor& w, Tensor& y) {
  check_shapes(p, cu_seqlens, x, w);
  expect_shape(y, {p.tokens, p.channels}, "causal_conv1d y");
  if (auto* cuda = cuda_body(MT_OP_BODIES(causal_conv1d_forward), {&cu_seqlens, &x, &w, &y}))
    return cuda(ctx, p, cu_seqlens, x, w, y);
  check_offsets(p, cu_seqlens);
  cpu::causal_conv1d_forward(ctx, p, cu_seqlens, x, w, y);
}

void causal_conv1d_backward(Context& ctx, const CausalConvParams& p, const Tensor& cu_seqlens,
                            const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                            Tensor& dw) {
  check_shapes(p, cu_seqlens, x, w);
  expect_shape(dy, {p.tokens, p.channels}, "causal_conv1d dy");
  expect_shape(dx, {p.tokens, p.channels}, "causal_conv1d dx");
  if (dw.defined()) expect_shape(dw, {p.channels, p.kernel}, "causal_conv1d dw");
  if (auto* cuda =
          cuda_body(MT_OP_BODIES(causal_conv1d_backward), {&cu_seqlens, &x, &w, &dy, &dx, &dw}))
    return cuda(ctx, p, cu_seqlens, x, w, dy, dx, dw);
  check_offsets(p, cu_seqlens);
  cpu::causal_conv1d_backward(ctx, p, cu_seqlens, x, w, dy, dx, dw);
}

}  // namespace mt::ops
