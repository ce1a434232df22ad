#include "ops/kda_step.h"

#include "ops/dispatch.h"
#include "ops/kda.h"

namespace mt::ops {

float KdaStepParams::qk_scale() const {
  return KdaParams{.head_k = head_k, .scale = scale}.qk_scale();  // one default for both forms
}

bool kda_step_fits(int64_t head_k) {
  return head_k > 0 && head_k <= 256;
}

void kda_recurrent_step(Context& ctx, const KdaStepParams& p, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& state,
                        Tensor& o) {
  const int64_t n = p.tokens, H = p.heads, K = p.head_k, V = p.head_v;
  MT_CHECK(n > 0 && H > 0 && K > 0 && V > 0, ValueError, "kda_recurrent_step: bad sizes tokens=", n,
           " heads=", H, " head_k=", K, " head_v=", V);
  expect_shape(q, {n, H, K}, "kda_recurrent_step q");
  expect_shape(k, {n, H, K}, "kda_recurrent_step k");
  expect_shape(v, {n, H, V}, "kda_recurrent_step v");
  expect_shape(g, {n, H, K}, "kda_recurrent_step g");
  expect_shape(beta, {n, H}, "kda_recurrent_step beta");
  expect_shape(o, {n, H, V}, "kda_recurrent_step o");
  MT_CHECK(state.numel() == H * K * V && state.ndim() >= 3 && state.dim(state.ndim() - 3) == H &&
               state.dim(state.ndim() - 2) == K && state.dim(state.ndim() - 1) == V &&
               state.is_contiguous(),
           ShapeError, "kda_recurrent_step state has shape ", state.shape(), ", expected [", H,
           ", ", K, ", ", V, "] (contiguous)");
  for (const Tensor* t : {&g, &beta, static_cast<const Tensor*>(&state)})
    MT_CHECK(t->dtype() == DType::F32, ShapeError,
             "kda_recurrent_step: g, beta and the state are fp32, got ", dtype_name(t->dtype()));
  for (const Tensor* t : {&k, &v, static_cast<const Tensor*>(&o)})
    MT_CHECK(t->dtype() == q.dtype() && (q.dtype() == DType::F32 || q.dtype() == DType::BF16),
             ShapeError, "kda_recurrent_step: q, k, v, o share one of f32 / bf16, got q ",
             dtype_name(q.dtype()), " and ", dtype_name(t->dtype()));
  dispatch(MT_OP_BODIES(kda_recurrent_step), {&q, &k, &v, &g, &beta, &state, &o}, ctx, p, q, k, v,
           g, beta, state, o);
}

}  // namespace mt::ops
