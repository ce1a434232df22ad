// KdaLayer::decode_step: the forward of kda_layer.cpp for n tokens that continue a document,
// starting from the carried recurrent state and convolution tails instead of zeros.
#include <algorithm>
#include <cstring>

#include "decode/decode.h"
#include "model/kda_layer.h"
#include "ops/activation.h"
#include "ops/conv1d.h"

namespace mt {

namespace {

Tensor one_doc(Arena& ws, int64_t n) {
  Tensor cu = ws.alloc({2}, DType::I32);
  cu.i32()[0] = 0;
  cu.i32()[1] = static_cast<int32_t>(n);
  return cu;
}

}  // namespace

void KdaLayer::decode_step(Context& ctx, KdaDecodeState& st, const Tensor& x, Tensor& y) {
  const int64_t n = x.dim(0), H = cfg_.heads, K = cfg_.head_dim, HK = hk(),
                tail = cfg_.conv_kernel - 1;
  expect_shape(x, {n, cfg_.hidden}, "kda decode x");
  expect_shape(y, {n, cfg_.hidden}, "kda decode y");
  expect_shape(st.state, {1, H, K, K}, "kda decode state");
  Arena& ws = ctx.workspace();
  ArenaScope scope(ws);
  Saved s;  // what a training forward would keep; decoding discards it

  // q, k, v: the short conv runs over [tail | new] as one document, so the new rows see exactly
  // the kernel-1 previous inputs (zeros at the document start); the tail then moves forward.
  const Tensor cu_conv = one_doc(ws, tail + n);
  auto branch = [&](LinearModule& proj, LinearModule::Saved& ps, const ParamRef& w,
                    Tensor& tail_buf) {
    Tensor buf = ws.alloc({tail + n, HK});
    if (tail > 0) std::memcpy(buf.f32(), tail_buf.f32(), sizeof(float) * tail * HK);
    Tensor newrows = ws.alloc({n, HK});
    proj.forward(ctx, x, newrows, ws, ps);
    std::memcpy(buf.f32() + tail * HK, newrows.f32(), sizeof(float) * n * HK);
    Tensor conv = ws.alloc({tail + n, HK});
    ops::causal_conv1d_forward(ctx, {.tokens = tail + n, .channels = HK, .kernel = tail + 1},
                               cu_conv, buf, w.value.view({HK, tail + 1}), conv);
    if (tail > 0) std::memcpy(tail_buf.f32(), buf.f32() + n * HK, sizeof(float) * tail * HK);
    Tensor out = ws.alloc({n, HK});
    Tensor conv_new = ws.alloc({n, HK});
    std::memcpy(conv_new.f32(), conv.f32() + tail * HK, sizeof(float) * n * HK);
    ops::silu_forward(ctx, conv_new, out);
    return out;
  };
  Tensor qs = branch(q_proj_, s.q_proj, q_conv_, st.q_tail);
  Tensor ks = branch(k_proj_, s.k_proj, k_conv_, st.k_tail);
  Tensor vs = branch(v_proj_, s.v_proj, v_conv_, st.v_tail);
  Tensor q = ws.alloc({n, H, K}), k = ws.alloc({n, H, K});
  qk_l2norm(ctx, qs, ks, q, k, ws, s);
  Tensor g = ws.alloc({n, HK}), beta = ws.alloc({n, H});
  decay_and_beta(ctx, x, g, beta, ws, s);

  // The delta-rule core from the carried state.
  ops::KdaParams cp = core_params(SeqInfo{});
  cp.tokens = n;
  cp.num_seqs = 1;
  const Tensor cu = one_doc(ws, n);
  Tensor o = ws.alloc({n, H, K}), hT = ws.alloc({1, H, K, K});
  Tensor saved = ws.alloc({ops::kda_saved_rows(cp, cu), H, K, K});
  Tensor no_prepared;  // one token: nothing to carry to a backward
  ops::kda_forward(ctx, cp, cu, q, k, vs.view({n, H, K}), g.view({n, H, K}), beta, st.state, o, hT,
                   saved, no_prepared);
  std::memcpy(st.state.f32(), hT.f32(), sizeof(float) * H * K * K);

  gated_output(ctx, x, o, y, ws, s);
}

}  // namespace mt
