// MlaLayer / DsaLayer decoding: the forwards of mla_layer.cpp and dsa_layer.cpp for n tokens that
// continue a document whose keys, values (and DSA indexer keys) are cached.
#include "decode/decode.h"
#include "model/dsa_layer.h"
#include "ops/cached_attention.h"

namespace mt {

Tensor MlaLayer::decode_select(Context&, AttnDecodeState&, const Tensor&, const Tensor&,
                               const Tensor&) {
  return Tensor();  // dense causal
}

void MlaLayer::decode_step(Context& ctx, const DecodeInputs& in, AttnDecodeState& st,
                           const Tensor& x, Tensor& y) {
  const int64_t n = x.dim(0), d = cfg_.hidden, H = cfg_.heads, Dqk = qk_dim(), Dv = cfg_.v_head_dim,
                pos0 = st.len;
  expect_shape(x, {n, d}, "mla decode x");
  expect_shape(y, {n, d}, "mla decode y");
  MT_CHECK(pos0 + n <= st.capacity, ValueError, "decode: ", pos0 + n,
           " tokens exceed the KV cache capacity ", st.capacity);
  MT_CHECK(in.seq.tokens == n, ShapeError, "mla decode: ", n, " rows for a step of ", in.seq.tokens,
           " tokens");
  const DType at = x.dtype();
  Arena& ws = ctx.workspace();
  ArenaScope scope(ws);
  Saved s;  // what a training forward would keep; decoding discards it
  const Tensor& positions = in.seq.positions;

  // The new keys and values go straight into the cache rows.
  Tensor q = ws.alloc({n, H, Dqk}, at);
  project_q(ctx, x, positions, q, ws, s);
  Tensor k_new = st.k.rows(pos0, pos0 + n), v_new = st.v.rows(pos0, pos0 + n);
  project_kv(ctx, x, positions, k_new, v_new, ws, s);

  // Attention over the selected cached positions (the new ones included, causally).
  const Tensor idx = decode_select(ctx, st, x, s.cqn, positions);
  Tensor o = ws.alloc({n, H, Dv}, at);
  ops::cached_attention_forward(ctx,
                                {.tokens = n,
                                 .heads = H,
                                 .qk_dim = Dqk,
                                 .v_dim = Dv,
                                 .cached = pos0 + n,
                                 .kmax = idx.defined() ? idx.dim(1) : 0,
                                 .scale = softmax_scale()},
                                q, st.k, st.v, positions, idx, o);
  st.len = pos0 + n;

  project_out(ctx, x, o.view({n, H * Dv}), y, ws, s);
}

Tensor DsaLayer::decode_select(Context& ctx, AttnDecodeState& st, const Tensor& x,
                               const Tensor& cqn, const Tensor& positions) {
  const int64_t n = x.dim(0), HI = dcfg_.index_heads, DI = dcfg_.index_head_dim, pos0 = st.len,
                cached = pos0 + n;
  Arena& ws = ctx.workspace();
  expect_shape(st.index_k, {st.capacity, DI}, "dsa decode indexer key cache");

  // Indexer keys of the new tokens, into the cache; queries and head weights.
  const DType at = x.dtype();
  Tensor qi = ws.alloc({n, HI * DI}, at), w = ws.alloc({n, HI}, at);
  Tensor kn_new = st.index_k.rows(pos0, cached);
  Saved discarded;  // what a training forward would keep
  project_indexer(ctx, x, cqn, positions, qi, kn_new, w, ws, discarded);
  if (dcfg_.dense_warmup) return Tensor();  // dense causal

  Tensor idx = ws.alloc({n, dcfg_.index_topk}, DType::I32);
  ops::cached_indexer_topk(
      ctx, {.tokens = n, .heads = HI, .head_dim = DI, .cached = cached, .topk = dcfg_.index_topk},
      qi.view({n, HI, DI}), st.index_k, w, positions, idx);
  return idx;
}

}  // namespace mt
