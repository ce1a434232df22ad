// KdaLayer::decode_step: the forward of kda_layer.cpp for n tokens that continue a document,
// starting from the carried recurrent state and convolution tails instead of zeros.
#include "decode/decode.h"
#include "model/kda_layer.h"
#include "ops/conv1d.h"
#include "ops/elementwise.h"
#include "ops/kda_step.h"

namespace mt {

void KdaLayer::decode_step(Context& ctx, const DecodeInputs& in, KdaDecodeState& st,
                           const Tensor& x, Tensor& y) {
  const int64_t n = x.dim(0), H = cfg_.heads, K = cfg_.head_dim, HK = hk(),
                tail = cfg_.conv_kernel - 1;
  expect_shape(x, {n, cfg_.hidden}, "kda decode x");
  expect_shape(y, {n, cfg_.hidden}, "kda decode y");
  expect_shape(st.state, {1, H, K, K}, "kda decode state");
  MT_CHECK(in.seq.tokens == n, ShapeError, "kda decode: ", n, " rows for a step of ", in.seq.tokens,
           " tokens");
  const DType at = x.dtype();
  Arena& ws = ctx.workspace();
  ArenaScope scope(ws);
  Saved s;  // what a training forward would keep; decoding discards it

  // q, k, v: the short conv runs over [tail | new] as one document, so the new rows see exactly
  // the kernel-1 previous inputs (zeros at the document start); the tail then moves forward.
  auto branch = [&](LinearModule& proj, LinearModule::Saved& ps, const ParamRef& w,
                    Tensor& tail_buf) {
    Tensor buf = ws.alloc({tail + n, HK}, at);
    Tensor old_rows = buf.rows(0, tail), new_rows = buf.rows(tail, tail + n);
    if (tail > 0) ops::copy(ctx, tail_buf, old_rows);  // the tail buffer is [tail, HK]
    proj.forward(ctx, x, new_rows, ws, ps);
    // SiLU(conv) in one op, as the training forward runs it (CausalConvParams::silu).
    Tensor conv = ws.alloc({tail + n, HK}, at);
    ops::causal_conv1d_forward(
        ctx, {.tokens = tail + n, .channels = HK, .kernel = tail + 1, .silu = true}, in.cu_conv,
        buf, w.value.view({HK, tail + 1}), conv);
    if (tail > 0) ops::copy(ctx, buf.rows(n, n + tail), tail_buf);
    return conv.rows(tail, tail + n);
  };
  Tensor qs = branch(q_proj_, s.q_proj, q_conv_, st.q_tail);
  Tensor ks = branch(k_proj_, s.k_proj, k_conv_, st.k_tail);
  Tensor vs = branch(v_proj_, s.v_proj, v_conv_, st.v_tail);
  Tensor q = ws.alloc({n, H, K}, at), k = ws.alloc({n, H, K}, at);
  qk_l2norm(ctx, qs, ks, q, k, ws, s);
  Tensor g = ws.alloc({n, HK}, DType::F32), beta = ws.alloc({n, H}, DType::F32);
  decay_and_beta(ctx, x, g, beta, ws, s);

  // The delta-rule core from the carried state.
  Tensor o = ws.alloc({n, H, K}, at);
  ops::KdaParams cp = core_params(in.seq);
  if (n <= in.kda_recurrent_max) {
    ops::kda_recurrent_step(ctx,
                            {.tokens = n, .heads = H, .head_k = K, .head_v = K, .scale = cp.scale},
                            q, k, vs.view({n, H, K}), g.view({n, H, K}), beta, st.state, o);
  } else {
    Tensor hT = ws.alloc({1, H, K, K}, DType::F32);
    Tensor saved = ws.alloc({ops::kda_saved_rows(cp, in.seq.cu_seqlens_host), H, K, K}, DType::F32);
    Tensor no_prepared;  // no backward follows
    ops::kda_forward(ctx, cp, in.seq.cu_seqlens, q, k, vs.view({n, H, K}), g.view({n, H, K}), beta,
                     st.state, o, hT, saved, no_prepared);
    ops::copy(ctx, hT, st.state);
  }

  gated_output(ctx, x, o, y, ws, s);
}

}  // namespace mt
