#include "io/hf_forward.h"

#include "core/seq_info.h"
#include "model/vision/vision_front.h"
#include "ops/gemm.h"

namespace mt {

ImageBatch read_image_inputs(const TensorMap& inputs) {
  ImageBatch b;
  auto pv = inputs.find("pixel_values");
  auto thw = inputs.find("image_grid_thw");
  MT_CHECK((pv == inputs.end()) == (thw == inputs.end()), ShapeError,
           "inputs need both pixel_values and image_grid_thw, or neither");
  if (pv == inputs.end()) return b;
  const Tensor& g = thw->second;
  MT_CHECK(g.ndim() == 2 && g.dim(1) == 3 && (g.dtype() == DType::I64 || g.dtype() == DType::I32),
           ShapeError, "image_grid_thw must be an int tensor [images, 3], got ", g.shape());
  std::vector<std::array<int64_t, 3>> rows;
  for (int64_t i = 0; i < g.dim(0); ++i) {
    std::array<int64_t, 3> r{};
    for (int64_t k = 0; k < 3; ++k)
      r[k] = g.dtype() == DType::I64 ? g.i64()[i * 3 + k] : g.i32()[i * 3 + k];
    rows.push_back(r);
  }
  b.grids = ops::grids_from_thw(rows);
  const Tensor& p = pv->second;
  MT_CHECK(p.ndim() >= 2 && p.dtype() == DType::F32, ShapeError,
           "pixel_values must be f32 [patches, ...], got ", p.shape());
  b.pixels = Tensor::empty({p.dim(0), p.numel() / p.dim(0)});
  b.pixels.copy_from(p.view({p.dim(0), p.numel() / p.dim(0)}));
  return b;
}

HfForwardResult hf_forward(Context& ctx, LoadedModel& lm, const Tensor& input_ids, bool grads,
                           const ImageBatch* images) {
  Model& m = *lm.model;
  const ModelConfig& cfg = m.config();
  MT_CHECK(input_ids.ndim() == 2 && input_ids.dim(0) > 0 && input_ids.dim(1) > 0, ShapeError,
           "input_ids must be [B, T] with B, T > 0, got ", input_ids.shape());
  MT_CHECK(input_ids.dtype() == DType::I32 || input_ids.dtype() == DType::I64, ShapeError,
           "input_ids must be an integer tensor, got ", dtype_name(input_ids.dtype()));
  const int64_t B = input_ids.dim(0), T = input_ids.dim(1), N = B * T, V = cfg.vocab;
  Tensor ids = Tensor::empty({N}, DType::I32);
  bool has_pad = false;
  for (int64_t i = 0; i < N; ++i) {
    int64_t v = input_ids.dtype() == DType::I32 ? input_ids.i32()[i] : input_ids.i64()[i];
    MT_CHECK(v >= 0 && v < V, ValueError, "input_ids[", i / T, ",", i % T, "] = ", v,
             " outside the vocabulary [0, ", V, ")");
    ids.i32()[i] = static_cast<int32_t>(v);
    has_pad |= v == lm.config.pad_token_id;
  }
  // Labels are the inputs shifted left inside each row; a row's last token has no target.
  Tensor targets = Tensor::empty({N}, DType::I32);
  for (int64_t i = 0; i < N; ++i) targets.i32()[i] = (i % T == T - 1) ? -100 : ids.i32()[i + 1];
  if (cfg.vision)
    for (int64_t i = 0; i < N; ++i)
      if (targets.i32()[i] == cfg.image_token_id) targets.i32()[i] = -100;
  m.set_images(images);

  // On a GPU context the model moves there for the computation and comes back to the host for
  // the export (the loaders and the exporters read host memory).
  const Device dev = ctx.device();
  m.to_device(dev);
  SeqInfo seq = SeqInfo::uniform(B, T);
  if (dev != Device::CPU) {
    ids = ids.to(dev);
    targets = targets.to(dev);
    seq.cu_seqlens = seq.cu_seqlens.to(dev);
    seq.positions = seq.positions.to(dev);
  }
  m.params().zero_grad();
  HfForwardResult r;
  r.loss = m.forward(ctx, seq, ids, targets, 0, grads ? Model::Pass::Train : Model::Pass::Eval);
  m.set_images(nullptr);

  const Param* head =
      m.params().find(cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  MT_CHECK(head != nullptr, InternalError, "model has no LM head weight");
  r.logits = Tensor::empty({B, T, V});
  Tensor flat = r.logits.view({N, V});
  if (dev == Device::CPU) {
    ops::matmul(ctx, m.final_hidden(), false, head->value, true, flat);
  } else {
    Tensor on_dev = Tensor::empty({N, V}, m.final_hidden().dtype(), dev);
    ops::matmul(ctx, m.final_hidden(), false, head->value, true, on_dev);
    flat.copy_from(on_dev);
  }

  if (grads) m.backward(ctx);
  m.to_device(Device::CPU);
  if (grads) {
    r.grads = export_hf_tensors(m, lm.config.model_type, /*grads=*/true);
    const int64_t pad = lm.config.pad_token_id;
    if (pad >= 0 && pad < V && has_pad) {
      // nn.Embedding(padding_idx) drops the lookup's gradient for that row; with tied weights
      // the LM head's share of the same row would have to be kept, which we cannot separate.
      MT_CHECK(!cfg.tie_embeddings, ValueError, "pad_token_id ", pad,
               " occurs in input_ids of a model with tied embeddings: its embedding gradient "
               "cannot be reproduced");
      Tensor& g = r.grads.at("model.embed_tokens.weight");
      std::fill(g.f32() + pad * cfg.hidden, g.f32() + (pad + 1) * cfg.hidden, 0.f);
    }
  }
  return r;
}

}  // namespace mt
