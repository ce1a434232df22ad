// One encoder layer of the kimi_k25 / MoonViT vision tower (transformers'
// Kimi_K25VisionEncoderLayer):
//   x1 = x + proj(attn(rope2d(q(ln1 x)), rope2d(k(ln1 x)), v(ln1 x)))   bidirectional per image
//   y  = x1 + fc2(gelu_tanh(fc1(ln2 x1)))
// LayerNorms with weight and bias; every projection has a bias (BiasedLinear; LoRA optional).
// Local HF names: norm1.*, attn.{q,k,v}_proj.*, attn.proj.*, norm2.*, mlp.fc1.*, mlp.fc2.*.
// Same contract as mt::Layer (layer.h), over a VisionBatch instead of a SeqInfo.
#pragma once

#include <vector>

#include "model/layer.h"
#include "model/vision/biased_linear.h"
#include "model/vision/vision_batch.h"
#include "ops/attention.h"
#include "ops/gelu.h"

namespace mt {

struct VisionBlockConfig {
  int64_t hidden = 0, heads = 0, intermediate = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  ops::GeluKind act = ops::GeluKind::Tanh;
  LoraSpec lora{};  // on all six projections when rank > 0
  int64_t head_dim() const { return heads ? hidden / heads : 0; }
};

class VisionBlock {
 public:
  explicit VisionBlock(const VisionBlockConfig& cfg);

  std::vector<ParamSpec> param_specs() const;
  void bind(const ParamTable& params);
  void plan_activations(const VisionBatch& batch, ArenaPlan& plan) const;
  // What forward keeps for backward (views of x and of acts), the caller's: one per batch of
  // images in flight.
  struct Saved {
    Tensor x, h1, mean1, rstd1, qr, kr, v_out, o, lse, x1, h2, mean2, rstd2, f, g;
    LinearModule::Saved q, k, v, proj, fc1, fc2;
  };
  // x, y [T, hidden]. `s` keeps a view of x (the caller keeps it alive until backward).
  void forward(Context& ctx, const VisionBatch& batch, const Tensor& x, Tensor& y, Arena& acts,
               Saved& s) const;
  // dx written; parameter gradients accumulate.
  void backward(Context& ctx, const VisionBatch& batch, const Tensor& dy, Tensor& dx,
                const Saved& s);

 private:
  ops::AttentionParams attn_params(const VisionBatch& batch) const;
  VisionBlockConfig cfg_;
  BiasedLinear q_, k_, v_, proj_, fc1_, fc2_;
  ParamRef n1w_, n1b_, n2w_, n2b_;
};

}  // namespace mt
