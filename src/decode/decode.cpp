#include "decode/decode.h"

#include <algorithm>
#include <string>

#include "model/dense_ffn.h"
#include "model/dsa_layer.h"
#include "model/kda_layer.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "ops/cached_attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/kda_step.h"
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

int64_t conv_tail(const ModelConfig& cfg) {
  return std::max<int64_t>(cfg.kda.conv_kernel - 1, 0);
}

}  // namespace

Decoder::Decoder(Model& model, int64_t max_tokens, const DecoderOptions& opt)
    : model_(model), max_tokens_(max_tokens), opt_(opt) {
  MT_CHECK(max_tokens > 0, ValueError, "decode: max_tokens must be positive, got ", max_tokens);
  MT_CHECK(opt.kda_recurrent_max >= 0, ValueError, "decode: kda_recurrent_max must be >= 0, got ",
           opt.kda_recurrent_max);
  const ModelConfig& cfg = model.config();
  const Device dev = model.params().device();
  const DType at = model.precision().activations;
  const size_t L = cfg.layers.size();
  kda_.resize(L);
  attn_.resize(L);
  // Decoding's GPU kernels have no other GPU path (the op table's kda_step_cuda,
  // cached_attention_cuda, cached_indexer_cuda): a shape they reject is refused here, before any
  // cache is allocated, naming the layer, rather than at the first step.
  const auto gpu_takes = [&](size_t i, bool fits, const char* op, auto... dims) {
    MT_CHECK(dev != Device::CUDA || fits, ShapeError, "decode on the GPU: layer ", i, " (",
             mixer_name(cfg.layers[i].mixer), "): ", op, " ", dims...,
             " past the kernel's shared memory (docs/gpu.md, decoding)");
  };
  for (size_t i = 0; i < L; ++i) {
    if (cfg.layers[i].mixer == MixerKind::Kda) {
      gpu_takes(i, ops::kda_step_fits(cfg.kda.head_dim), "the KDA step's head_dim",
                cfg.kda.head_dim);
    } else {
      const bool dsa = cfg.layers[i].mixer == MixerKind::Dsa;
      const MlaConfig& m = dsa ? cfg.dsa.mla : cfg.mla;
      const int64_t qk = m.qk_nope_dim + m.qk_rope_dim;
      gpu_takes(i, ops::cached_attention_fits(qk, m.v_head_dim), "cached attention's head dims", qk,
                "/", m.v_head_dim);
      if (dsa && !cfg.dsa.dense_warmup)
        gpu_takes(i, ops::cached_indexer_fits(cfg.dsa.index_heads, cfg.dsa.index_head_dim),
                  "the cached indexer's heads x head_dim", cfg.dsa.index_heads, " x ",
                  cfg.dsa.index_head_dim);
    }
  }
  for (size_t i = 0; i < L; ++i) {
    if (cfg.layers[i].mixer == MixerKind::Kda) {
      const KdaConfig& k = cfg.kda;
      const int64_t HK = k.heads * k.head_dim;
      KdaDecodeState& s = kda_[i];
      s.state = Tensor::empty({1, k.heads, k.head_dim, k.head_dim}, DType::F32, dev);
      for (Tensor* t : {&s.q_tail, &s.k_tail, &s.v_tail})
        *t = Tensor::empty({std::max<int64_t>(conv_tail(cfg), 1), HK}, at, dev);
    } else {
      const bool dsa = cfg.layers[i].mixer == MixerKind::Dsa;
      const MlaConfig& m = dsa ? cfg.dsa.mla : cfg.mla;
      AttnDecodeState& s = attn_[i];
      s.capacity = max_tokens;
      s.k = Tensor::empty({max_tokens, m.heads, m.qk_nope_dim + m.qk_rope_dim}, at, dev);
      s.v = Tensor::empty({max_tokens, m.heads, m.v_head_dim}, at, dev);
      if (dsa) s.index_k = Tensor::empty({max_tokens, cfg.dsa.index_head_dim}, at, dev);
    }
  }
  staged_host_ = Tensor::empty({2 * max_tokens + 4}, DType::I32);
  staged_ =
      dev == Device::CPU ? staged_host_ : Tensor::empty({2 * max_tokens + 4}, DType::I32, dev);
  reset();
}

void Decoder::reset() {
  pos_ = 0;
  for (KdaDecodeState& s : kda_)
    for (Tensor* t : {&s.state, &s.q_tail, &s.k_tail, &s.v_tail})
      if (t->defined()) t->zero_();
  for (AttnDecodeState& s : attn_) s.len = 0;
}

void Decoder::step(Context& ctx, const Tensor& ids, Tensor& logits) {
  const ModelConfig& cfg = model_.config();
  const int64_t n = ids.numel(), d = cfg.hidden, V = cfg.vocab;
  MT_CHECK(ids.ndim() == 1 && n >= 1 && ids.dtype() == DType::I32 && ids.device() == Device::CPU,
           ShapeError, "decode: ids must be host i32 [n >= 1], got ", ids.shape(), " ",
           dtype_name(ids.dtype()), " on ", device_name(ids.device()));
  const int64_t rows = logits.ndim() == 2 && logits.dim(0) == 1 ? 1 : n;
  expect_shape(logits, {rows, V}, "decode logits");
  MT_CHECK(logits.device() == Device::CPU && logits.dtype() == DType::F32, ShapeError,
           "decode: logits must be host f32, got ", dtype_name(logits.dtype()), " on ",
           device_name(logits.device()));
  MT_CHECK(pos_ + n <= max_tokens_, ValueError, "decode: document of ", pos_ + n,
           " tokens exceeds the decoder capacity ", max_tokens_);
  const Device dev = model_.params().device();
  MT_CHECK(ctx.device() == dev, ValueError, "decode: the model is on ", device_name(dev),
           ", the context on ", device_name(ctx.device()));
  MT_CHECK(dev != Device::CPU || model_.precision() == Precision::fp32(), ConfigError,
           "decode: precision \"", precision_name(model_.precision()),
           "\" cannot run on the CPU: its ops compute and store fp32 only");

  // Everything the step's ops read that the host decides, in one buffer and one copy:
  // ids | positions | {0, n} | {0, tail + n}.
  const int64_t tail = conv_tail(cfg);
  int32_t* h = staged_host_.i32();
  for (int64_t i = 0; i < n; ++i) {
    h[i] = ids.i32()[i];
    h[n + i] = static_cast<int32_t>(pos_ + i);
  }
  int32_t* cu = h + 2 * n;
  cu[0] = 0;
  cu[1] = static_cast<int32_t>(n);
  cu[2] = 0;
  cu[3] = static_cast<int32_t>(tail + n);
  Tensor staged = staged_.rows(0, 2 * n + 4);
  if (dev != Device::CPU) staged.copy_from(staged_host_.rows(0, 2 * n + 4));
  DecodeInputs in;
  in.ids = staged.rows(0, n);
  in.seq.tokens = n;
  in.seq.num_seqs = 1;
  in.seq.positions = staged.rows(n, 2 * n);
  in.seq.cu_seqlens = staged.rows(2 * n, 2 * n + 2);
  in.seq.cu_seqlens_host = staged_host_.rows(2 * n, 2 * n + 2);
  in.seq.offsets = {0, n};
  in.cu_conv = staged.rows(2 * n + 2, 2 * n + 4);
  in.kda_recurrent_max = opt_.kda_recurrent_max;

  const DType at = model_.precision().activations;
  Arena& ws = ctx.workspace();
  ArenaScope scope(ws);
  const ops::NormParams np{.rows = n, .dim = d, .eps = cfg.norm_eps};
  Tensor x = ws.alloc({n, d}, at), normed = ws.alloc({n, d}, at), rstd = ws.alloc({n}),
         out = ws.alloc({n, d}, at);
  ops::embedding_forward(ctx, {.tokens = n, .vocab = V, .dim = d}, in.ids,
                         weight(model_, "model.embed_tokens.weight"), x);
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    const int li = static_cast<int>(i);
    ops::rmsnorm_forward(ctx, np, x, weight(model_, layer_name(i, "input_layernorm")), normed,
                         rstd);
    if (cfg.layers[i].mixer == MixerKind::Kda)
      dynamic_cast<KdaLayer&>(model_.mixer(li)).decode_step(ctx, in, kda_[i], normed, out);
    else
      dynamic_cast<MlaLayer&>(model_.mixer(li)).decode_step(ctx, in, attn_[i], normed, out);
    ops::add_into(ctx, out, x);
    ops::rmsnorm_forward(ctx, np, x, weight(model_, layer_name(i, "post_attention_layernorm")),
                         normed, rstd);
    if (cfg.layers[i].ffn == FfnKind::Dense)
      dynamic_cast<DenseFfn&>(model_.ffn(li)).decode_step(ctx, in.seq, normed, out, ffn_acts_);
    else
      dynamic_cast<MoeLayer&>(model_.ffn(li)).decode_step(ctx, in.seq, normed, out, ffn_acts_);
    ops::add_into(ctx, out, x);
  }
  // The LM head on the rows the caller asked for.
  Tensor last = normed.rows(n - rows, n), last_in = x.rows(n - rows, n);
  Tensor last_rstd = rstd.rows(0, rows);
  ops::rmsnorm_forward(ctx, {.rows = rows, .dim = d, .eps = cfg.norm_eps}, last_in,
                       weight(model_, "model.norm.weight"), last, last_rstd);
  const Tensor& head =
      weight(model_, cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  if (dev == Device::CPU) {
    ops::matmul(ctx, last, false, head, true, logits);
  } else {
    // f32 whatever the model's dtype (the GEMM takes bf16 operands with an f32 result): sampling
    // needs more than bf16's 8 bits (near-ties, the temperature's softmax), and a same-dtype copy
    // is one device-to-host memcpy, with no host conversion per token.
    Tensor on_dev = ws.alloc({rows, V}, DType::F32);
    ops::matmul(ctx, last, false, head, true, on_dev);
    logits.copy_from(on_dev);  // waits for the step: the one read per token
  }
  pos_ += n;
  rows_ += n;
}

}  // namespace mt
