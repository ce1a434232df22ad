#include "decode/decode.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "model/dense_ffn.h"
#include "model/dsa_layer.h"
#include "model/kda_layer.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/norm.h"

namespace mt {

namespace {

const Tensor& weight(const Model& m, const std::string& name) {
  const Param* p = m.params().find(name);
  MT_CHECK(p != nullptr, InternalError, "decode: model has no parameter ", name);
  return p->value;
}

std::string layer_name(size_t i, const char* what) {
  return "model.layers." + std::to_string(i) + "." + what + ".weight";
}

}  // namespace

Decoder::Decoder(Model& model, int64_t max_tokens) : model_(model), max_tokens_(max_tokens) {
  MT_CHECK(max_tokens > 0, ValueError, "decode: max_tokens must be positive, got ", max_tokens);
  const ModelConfig& cfg = model.config();
  const size_t L = cfg.layers.size();
  kda_.resize(L);
  attn_.resize(L);
  for (size_t i = 0; i < L; ++i) {
    if (cfg.layers[i].mixer == MixerKind::Kda) {
      const KdaConfig& k = cfg.kda;
      const int64_t HK = k.heads * k.head_dim, tail = k.conv_kernel - 1;
      KdaDecodeState& s = kda_[i];
      s.state = Tensor::empty({1, k.heads, k.head_dim, k.head_dim});
      for (Tensor* t : {&s.q_tail, &s.k_tail, &s.v_tail})
        *t = Tensor::empty({std::max<int64_t>(tail, 1), HK});
    } else {
      const bool dsa = cfg.layers[i].mixer == MixerKind::Dsa;
      const MlaConfig& m = dsa ? cfg.dsa.mla : cfg.mla;
      AttnDecodeState& s = attn_[i];
      s.capacity = max_tokens;
      s.k = Tensor::empty({max_tokens, m.heads, m.qk_nope_dim + m.qk_rope_dim});
      s.v = Tensor::empty({max_tokens, m.heads, m.v_head_dim});
      if (dsa) s.index_k = Tensor::empty({max_tokens, cfg.dsa.index_head_dim});
    }
  }
  reset();
}

void Decoder::reset() {
  pos_ = 0;
  for (KdaDecodeState& s : kda_)
    for (Tensor* t : {&s.state, &s.q_tail, &s.k_tail, &s.v_tail})
      if (t->defined()) std::memset(t->f32(), 0, sizeof(float) * static_cast<size_t>(t->numel()));
  for (AttnDecodeState& s : attn_) s.len = 0;
}

void Decoder::step(Context& ctx, const Tensor& ids, Tensor& logits) {
  const ModelConfig& cfg = model_.config();
  const int64_t n = ids.numel(), d = cfg.hidden, V = cfg.vocab;
  MT_CHECK(ids.ndim() == 1 && n >= 1, ShapeError, "decode: ids must be i32 [n >= 1], got ",
           ids.shape());
  expect_shape(logits, {n, V}, "decode logits");
  MT_CHECK(pos_ + n <= max_tokens_, ValueError, "decode: document of ", pos_ + n,
           " tokens exceeds the decoder capacity ", max_tokens_);
  Arena& ws = ctx.workspace();
  ArenaScope scope(ws);
  const ops::NormParams np{.rows = n, .dim = d, .eps = cfg.norm_eps};

  Tensor h = ws.alloc({n, d}), normed = ws.alloc({n, d}), rstd = ws.alloc({n}),
         out = ws.alloc({n, d});
  ops::embedding_forward(ctx, {.tokens = n, .vocab = V, .dim = d}, ids,
                         weight(model_, "model.embed_tokens.weight"), h);
  auto add = [&](const Tensor& a) {
    for (int64_t i = 0; i < n * d; ++i) h.f32()[i] += a.f32()[i];
  };
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    const int li = static_cast<int>(i);
    ops::rmsnorm_forward(ctx, np, h, weight(model_, layer_name(i, "input_layernorm")), normed,
                         rstd);
    if (cfg.layers[i].mixer == MixerKind::Kda)
      dynamic_cast<KdaLayer&>(model_.mixer(li)).decode_step(ctx, kda_[i], normed, out);
    else
      dynamic_cast<MlaLayer&>(model_.mixer(li)).decode_step(ctx, attn_[i], normed, out);
    add(out);
    ops::rmsnorm_forward(ctx, np, h, weight(model_, layer_name(i, "post_attention_layernorm")),
                         normed, rstd);
    if (cfg.layers[i].ffn == FfnKind::Dense)
      dynamic_cast<DenseFfn&>(model_.ffn(li)).decode_step(ctx, normed, out);
    else
      dynamic_cast<MoeLayer&>(model_.ffn(li)).decode_step(ctx, normed, out);
    add(out);
  }
  ops::rmsnorm_forward(ctx, np, h, weight(model_, "model.norm.weight"), normed, rstd);
  const Tensor& head =
      weight(model_, cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  ops::matmul(ctx, normed, false, head, true, logits);
  pos_ += n;
  rows_ += n;
}

}  // namespace mt
