#include "model/model.h"

#include <algorithm>

#include "model/dense_ffn.h"
#include "model/dsa_layer.h"
#include "model/kda_layer.h"
#include "model/mla_layer.h"
#include "model/moe_layer.h"
#include "model/vision/vision_front.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/grouped_ffn.h"
#include "ops/norm.h"

namespace mt {

namespace {

std::string layer_prefix(size_t i) {
  return "model.layers." + std::to_string(i) + ".";
}

ParamSpec ones(const std::string& name, int64_t n) {
  return ParamSpec{.name = name, .shape = {n}, .init = ParamInit::Ones};
}

std::vector<ParamSpec> stored_as(std::vector<ParamSpec> specs, const Precision& precision) {
  for (ParamSpec& s : specs) s.dtype = param_dtype(s, precision);
  return specs;
}

}  // namespace

std::unique_ptr<Layer> make_mixer(const ModelConfig& cfg, MixerKind kind) {
  switch (kind) {
    case MixerKind::Kda:
      return std::make_unique<KdaLayer>(cfg.kda);
    case MixerKind::Dsa:
      return std::make_unique<DsaLayer>(cfg.dsa);
    case MixerKind::Mla:
      return std::make_unique<MlaLayer>(cfg.mla);
  }
  MT_THROW(InternalError, "unknown mixer kind");
}

std::unique_ptr<Layer> make_ffn(const ModelConfig& cfg, FfnKind kind) {
  if (kind == FfnKind::Dense) return std::make_unique<DenseFfn>(cfg.dense);
  return std::make_unique<MoeLayer>(cfg.moe);
}

std::vector<NamedSpec> model_param_specs(const ModelConfig& cfg, const Precision& precision) {
  std::vector<NamedSpec> out;
  out.push_back({"model.embed_tokens.weight",
                 {.name = "weight", .shape = {cfg.vocab, cfg.hidden}, .std = cfg.init_std}});
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    std::string p = layer_prefix(i);
    out.push_back({p + "input_layernorm.weight", ones("weight", cfg.hidden)});
    for (ParamSpec& s : make_mixer(cfg, cfg.layers[i].mixer)->param_specs())
      out.push_back({p + "self_attn." + s.name, s});
    out.push_back({p + "post_attention_layernorm.weight", ones("weight", cfg.hidden)});
    for (ParamSpec& s : make_ffn(cfg, cfg.layers[i].ffn)->param_specs())
      out.push_back({p + "mlp." + s.name, s});
  }
  out.push_back({"model.norm.weight", ones("weight", cfg.hidden)});
  if (!cfg.tie_embeddings)
    out.push_back({"lm_head.weight",
                   {.name = "weight", .shape = {cfg.vocab, cfg.hidden}, .std = cfg.init_std}});
  if (cfg.vision) {
    VisionFrontEnd v(*cfg.vision, cfg.image_token_id);
    for (ParamSpec& s : v.tower_specs()) out.push_back({VisionFrontEnd::kTowerPrefix + s.name, s});
    for (ParamSpec& s : v.projector_specs())
      out.push_back({VisionFrontEnd::kProjectorPrefix + s.name, s});
  }
  for (NamedSpec& s : out) s.spec.dtype = param_dtype(s.spec, precision);
  return out;
}

Model::Model(const ModelConfig& cfg, uint64_t seed, const ModelOptions& opt)
    : cfg_(cfg),
      params_(opt.device),
      kernels_(opt.kernels),
      precision_(opt.precision),
      recompute_(opt.recompute) {
  MT_CHECK(kernels_.empty() || kernels_.size() == cfg.layers.size(), ConfigError,
           "model options name kernels for ", kernels_.size(), " layers, the model has ",
           cfg.layers.size());
  params_.set_tiled_init(opt.tiled_init);
  params_.set_deferred(opt.defer_weights);
  Rng rng(seed);
  std::string prefix;  // of the layer being added, for also_train's full names
  auto trainable = [&](const ParamSpec& s) {
    return !opt.freeze_base || s.role == ParamRole::Lora ||
           (opt.also_train && opt.also_train(prefix + s.name));
  };
  auto single = [&](const std::string& name, const ParamSpec& s) {
    prefix = name.substr(0, name.size() - s.name.size());
    return params_.add_layer(prefix, stored_as({s}, precision_), rng, trainable).at(s.name);
  };
  embed_ = single("model.embed_tokens.weight",
                  {.name = "weight", .shape = {cfg.vocab, cfg.hidden}, .std = cfg.init_std});
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    std::string p = layer_prefix(i);
    norm_in_.push_back(single(p + "input_layernorm.weight", ones("weight", cfg.hidden)));
    ModelConfig layer_cfg = cfg;
    if (!kernels_.empty()) layer_cfg.kda.chunked = kernels_[i].kda == KdaImpl::Chunked;
    auto mixer = make_mixer(layer_cfg, cfg.layers[i].mixer);
    prefix = p + "self_attn.";
    mixer->bind(
        params_.add_layer(prefix, stored_as(mixer->param_specs(), precision_), rng, trainable));
    mixers_.push_back(std::move(mixer));
    norm_post_.push_back(single(p + "post_attention_layernorm.weight", ones("weight", cfg.hidden)));
    auto ffn = make_ffn(cfg, cfg.layers[i].ffn);
    prefix = p + "mlp.";
    ParamTable ffn_table =
        params_.add_layer(prefix, stored_as(ffn->param_specs(), precision_), rng, trainable);
    if (auto* moe = dynamic_cast<MoeLayer*>(ffn.get())) moe->set_grouped_gemm(opt.grouped_gemm);
    ffns_.push_back(std::move(ffn));
    if (pad_experts(i))
      for (auto& [name, ref] : ffn_table) ref.value = params_.at(prefix + name).value;
    ffns_.back()->bind(ffn_table);
  }
  final_norm_ = single("model.norm.weight", ones("weight", cfg.hidden));
  lm_head_ =
      cfg.tie_embeddings
          ? embed_
          : single("lm_head.weight",
                   {.name = "weight", .shape = {cfg.vocab, cfg.hidden}, .std = cfg.init_std});
  head_trains_ = lm_head_.trainable();
  if (cfg.vision) {
    vision_ = std::make_unique<VisionFrontEnd>(*cfg.vision, cfg.image_token_id);
    prefix = VisionFrontEnd::kTowerPrefix;
    params_.add_layer(prefix, stored_as(vision_->tower_specs(), precision_), rng, trainable);
    prefix = VisionFrontEnd::kProjectorPrefix;
    params_.add_layer(prefix, stored_as(vision_->projector_specs(), precision_), rng, trainable);
    vision_->bind(params_);
  }
}

Model::~Model() = default;

void Model::plan_layer(size_t i, const SeqInfo& seq, ArenaPlan& p) const {
  const Shape act{seq.tokens, cfg_.hidden}, row{seq.tokens};
  p.add(act);       // normed input
  p.add_fp32(row);  // its rstd
  mixers_[i]->plan_activations(seq, p);
  p.add(act);  // mixer output, then residual after the mixer
  p.add(act);  // normed mid
  p.add_fp32(row);
  if (recompute_ != ActivationRecompute::Selective) ffns_[i]->plan_activations(seq, p);
  p.add(act);  // ffn output, then the next residual
}

void Model::plan(const SeqInfo& seq, ArenaPlan& p) const {
  const Shape act{seq.tokens, cfg_.hidden}, row{seq.tokens};
  p.add(act);  // embedding output = residual 0
  for (size_t i = 0; i < mixers_.size(); ++i) {
    if (recompute_ == ActivationRecompute::Full)
      p.add(act);  // the next residual only; the layer itself lives in the scratch arena
    else
      plan_layer(i, seq, p);
  }
  p.add(act);  // final norm
  p.add_fp32(row);
  p.add_fp32(row);  // lse
  p.add(act);       // the head's input gradient (a Train forward of a frozen head)
}

size_t Model::scratch_bytes(const SeqInfo& seq) const {
  if (recompute_ == ActivationRecompute::None) return 0;
  size_t most = 0;
  for (size_t i = 0; i < mixers_.size(); ++i) {
    ArenaPlan p(precision_.activations, params_.device());
    if (recompute_ == ActivationRecompute::Full) {
      plan_layer(i, seq, p);
    } else {
      p.add({seq.tokens, cfg_.hidden});  // the replayed FFN's output (discarded)
      ffns_[i]->plan_activations(seq, p);
    }
    most = std::max(most, p.bytes());
  }
  return most;
}

size_t Model::activation_bytes(const SeqInfo& seq) const {
  ArenaPlan p(precision_.activations, params_.device());
  plan(seq, p);
  return p.bytes() + scratch_bytes(seq);
}

Model::MicroBatch& Model::micro_batch(int slot) {
  MT_CHECK(slot >= 0, ValueError, "micro-batch slot ", slot, " is negative");
  const auto k = static_cast<size_t>(slot);
  if (k >= slots_.size()) slots_.resize(k + 1);
  if (!slots_[k]) {
    auto mb = std::make_unique<MicroBatch>();
    for (const auto& m : mixers_) mb->mixer.push_back(m->make_state());
    for (const auto& f : ffns_) mb->ffn.push_back(f->make_state());
    if (vision_) mb->vision = vision_->make_state();
    slots_[k] = std::move(mb);
  }
  return *slots_[k];
}

size_t Model::activation_bytes_used() const {
  const size_t k = static_cast<size_t>(last_slot_);
  const size_t acts = k < slots_.size() && slots_[k] ? slots_[k]->acts.used() : 0;
  return acts + scratch_.peak();
}

const Tensor& Model::final_hidden() const {
  const size_t k = static_cast<size_t>(last_slot_);
  MT_CHECK(k < slots_.size() && slots_[k], InternalError, "Model::final_hidden before a forward");
  return slots_[k]->final_h;
}

void Model::layer_forward(Context& ctx, MicroBatch& mb, size_t i, Arena& la, Arena& fa,
                          Tensor& out) {
  const int64_t T = mb.seq.tokens, d = cfg_.hidden;
  const ops::NormParams np{.rows = T, .dim = d, .eps = cfg_.norm_eps};
  const DType at = precision_.activations;
  mb.normed_in[i] = la.alloc({T, d}, at);
  mb.rstd_in[i] = la.alloc({T}, DType::F32);
  ops::rmsnorm_forward(ctx, np, mb.resid[i], norm_in_[i].value, mb.normed_in[i], mb.rstd_in[i]);
  Tensor m = la.alloc({T, d}, at);
  mixers_[i]->forward(ctx, mb.seq, mb.normed_in[i], m, la, *mb.mixer[i]);
  ops::add_into(ctx, mb.resid[i], m);  // m becomes the residual after the mixer
  mb.mid[i] = m;
  mb.normed_post[i] = la.alloc({T, d}, at);
  mb.rstd_post[i] = la.alloc({T}, DType::F32);
  ops::rmsnorm_forward(ctx, np, mb.mid[i], norm_post_[i].value, mb.normed_post[i], mb.rstd_post[i]);
  out = la.alloc({T, d}, at);
  ffns_[i]->forward(ctx, mb.seq, mb.normed_post[i], out, fa, *mb.ffn[i]);
  ops::add_into(ctx, mb.mid[i], out);
}

void Model::replay_ffn(Context& ctx, MicroBatch& mb, size_t i) {
  // Identical inputs and kernels give identical saved state, so the gradients equal the
  // no-recompute run's bit for bit. The MoE load counts a step once: restore it after the replay.
  auto* moe = dynamic_cast<MoeLayer*>(ffns_[i].get());
  std::vector<int64_t> load;
  if (moe) load = moe->expert_load();
  scratch_.reset();
  Tensor out = scratch_.alloc({mb.seq.tokens, cfg_.hidden}, precision_.activations);
  ffns_[i]->forward(ctx, mb.seq, mb.normed_post[i], out, scratch_, *mb.ffn[i]);
  if (moe) moe->set_expert_load(std::move(load));
}

double Model::forward(Context& ctx, const SeqInfo& seq, const Tensor& ids, const Tensor& targets,
                      int slot, Pass pass) {
  const int64_t T = seq.tokens, d = cfg_.hidden;
  expect_shape(ids, {T}, "input ids");
  expect_shape(targets, {T}, "targets");
  MT_CHECK(ctx.device() != Device::CPU || precision_ == Precision::fp32(), ConfigError,
           "precision \"", precision_name(precision_),
           "\" cannot run on the CPU: its ops compute and store fp32 only (set model.precision = "
           "\"fp32\")");
  MT_CHECK(ctx.device() == params_.device(), ValueError, "the model's parameters are on ",
           device_name(params_.device()), ", the step's context on ", device_name(ctx.device()));
  MicroBatch& mb = micro_batch(slot);
  last_slot_ = slot;
  ArenaPlan main_plan(precision_.activations, params_.device());
  plan(seq, main_plan);
  const size_t need = main_plan.bytes(), scratch = scratch_bytes(seq);
  if (mb.acts.capacity() != need) mb.acts = Arena(need, ctx.device(), "activations");
  mb.acts.reset();
  // A fresh arena each step, so that its peak is this step's.
  scratch_ = scratch > 0 ? Arena(scratch, ctx.device(), "recompute scratch") : Arena();
  mb.seq = seq;
  mb.ids = ids;
  mb.targets = targets;
  const size_t L = mixers_.size();
  mb.resid.assign(L + 1, Tensor());
  mb.normed_in.assign(L, Tensor());
  mb.rstd_in.assign(L, Tensor());
  mb.mid.assign(L, Tensor());
  mb.normed_post.assign(L, Tensor());
  mb.rstd_post.assign(L, Tensor());
  const ops::NormParams np{.rows = T, .dim = d, .eps = cfg_.norm_eps};
  const DType at = precision_.activations;

  // A Train forward's backward follows: layers may leave readouts to it (LayerState). A replay
  // (recompute) reuses the states, and with them this flag.
  for (size_t i = 0; i < L; ++i) {
    mb.mixer[i]->backward_follows = pass == Pass::Train;
    mb.ffn[i]->backward_follows = pass == Pass::Train;
    mb.mixer[i]->no_backward = mb.ffn[i]->no_backward = pass == Pass::Eval;
  }
  const int head = static_cast<int>(L) + 1;
  mb.resid[0] = mb.acts.alloc({T, d}, at);
  if (hooks_) hooks_->before_forward(0);
  ops::embedding_forward(ctx, {.tokens = T, .vocab = cfg_.vocab, .dim = d}, ids, embed_.value,
                         mb.resid[0]);
  if (vision_) vision_->forward(ctx, ids, images_, mb.resid[0], *mb.vision);
  if (hooks_) hooks_->after_forward(0);
  for (size_t i = 0; i < L; ++i) {
    const int unit = static_cast<int>(i) + 1;
    if (hooks_) hooks_->before_forward(unit);
    if (recompute_ == ActivationRecompute::Full) {
      mb.resid[i + 1] = mb.acts.alloc({T, d}, at);
      scratch_.reset();
      Tensor out;
      layer_forward(ctx, mb, i, scratch_, scratch_, out);
      mb.resid[i + 1].copy_from(out);
    } else if (recompute_ == ActivationRecompute::Selective) {
      scratch_.reset();
      layer_forward(ctx, mb, i, mb.acts, scratch_, mb.resid[i + 1]);
    } else {
      layer_forward(ctx, mb, i, mb.acts, mb.acts, mb.resid[i + 1]);
    }
    if (hooks_) hooks_->after_forward(unit);
  }
  mb.final_h = mb.acts.alloc({T, d}, at);
  mb.final_rstd = mb.acts.alloc({T}, DType::F32);
  if (hooks_) hooks_->before_forward(head);
  ops::rmsnorm_forward(ctx, np, mb.resid[L], final_norm_.value, mb.final_h, mb.final_rstd);
  mb.lse = mb.acts.alloc({T}, DType::F32);
  mb.have_forward = true;
  mb.eval_forward = pass == Pass::Eval;
  ensure_scalar(loss_, ctx.device());
  const ops::CrossEntropyParams cp{.tokens = T,
                                   .hidden = d,
                                   .vocab = cfg_.vocab,
                                   .chunk_tokens = ops::ce_chunk_tokens(ctx.device())};
  mb.head_dh = mb.acts.alloc({T, d}, at);
  mb.head_dh_valid = pass == Pass::Train && !head_trains_;
  mb.head_dloss = loss_weight_;
  if (mb.head_dh_valid)
    ops::lm_head_cross_entropy_forward_backward(ctx, cp, mb.final_h, lm_head_.value, targets,
                                                loss_weight_, mb.lse, loss_, mb.head_dh);
  else
    ops::lm_head_cross_entropy_forward(ctx, cp, mb.final_h, lm_head_.value, targets, mb.lse, loss_);
  if (hooks_) hooks_->after_forward(head);
  return read_scalar(loss_);
}

void Model::backward(Context& ctx, int slot) {
  MicroBatch& mb = micro_batch(slot);
  MT_CHECK(mb.have_forward, InternalError, "Model::backward of micro-batch slot ", slot,
           " without its forward");
  MT_CHECK(!mb.eval_forward, InternalError, "Model::backward of micro-batch slot ", slot,
           " after an Eval forward (it kept nothing for backward)");
  const int64_t T = mb.seq.tokens, d = cfg_.hidden;
  const ops::NormParams np{.rows = T, .dim = d, .eps = cfg_.norm_eps};
  ArenaScope scope(ctx.workspace());
  const DType at = precision_.activations;
  Tensor dresid = ctx.workspace().alloc({T, d}, at);
  Tensor dtmp = ctx.workspace().alloc({T, d}, at);
  Tensor dnormed = ctx.workspace().alloc({T, d}, at);

  const size_t L = mixers_.size();
  const int head = static_cast<int>(L) + 1;
  // Another slot's forward may have re-made the scratch arena for a smaller batch.
  const size_t scratch = scratch_bytes(mb.seq);
  if (scratch_.capacity() < scratch) scratch_ = Arena(scratch, ctx.device(), "recompute scratch");
  if (hooks_) hooks_->before_backward(head);
  // The head's input gradient from a Train forward, unless the loss weight changed since.
  const bool head_done = mb.head_dh_valid && mb.head_dloss == loss_weight_;
  if (!head_done)
    ops::lm_head_cross_entropy_backward(ctx,
                                        {.tokens = T,
                                         .hidden = d,
                                         .vocab = cfg_.vocab,
                                         .chunk_tokens = ops::ce_chunk_tokens(ctx.device())},
                                        mb.final_h, lm_head_.value, mb.targets, mb.lse,
                                        loss_weight_, dnormed, lm_head_.grad);
  ops::rmsnorm_backward(ctx, np, mb.resid[L], final_norm_.value, mb.final_rstd,
                        head_done ? mb.head_dh : dnormed, dresid, final_norm_.grad);
  if (hooks_) hooks_->after_backward(head);
  for (size_t i = L; i-- > 0;) {
    const int unit = static_cast<int>(i) + 1;
    if (hooks_) hooks_->before_backward(unit);
    if (recompute_ == ActivationRecompute::Full) {
      // Replay the forward from the kept input; identical inputs and kernels give identical
      // saved state, so the gradients equal the no-recompute run's bit for bit.
      auto* moe = dynamic_cast<MoeLayer*>(ffns_[i].get());
      std::vector<int64_t> load;
      if (moe) load = moe->expert_load();
      scratch_.reset();
      Tensor out;
      layer_forward(ctx, mb, i, scratch_, scratch_, out);
      if (moe) moe->set_expert_load(std::move(load));
    } else if (recompute_ == ActivationRecompute::Selective) {
      replay_ffn(ctx, mb, i);
    }
    // resid[i+1] = mid + ffn(norm(mid))
    ffns_[i]->backward(ctx, mb.seq, dresid, dnormed, *mb.ffn[i]);
    ops::rmsnorm_backward(ctx, np, mb.mid[i], norm_post_[i].value, mb.rstd_post[i], dnormed, dtmp,
                          norm_post_[i].grad);
    ops::add_into(ctx, dtmp, dresid);
    // mid = resid[i] + mixer(norm(resid[i]))
    mixers_[i]->backward(ctx, mb.seq, dresid, dnormed, *mb.mixer[i]);
    ops::rmsnorm_backward(ctx, np, mb.resid[i], norm_in_[i].value, mb.rstd_in[i], dnormed, dtmp,
                          norm_in_[i].grad);
    ops::add_into(ctx, dtmp, dresid);
    if (hooks_) hooks_->after_backward(unit);
  }
  if (hooks_) hooks_->before_backward(0);
  if (vision_) vision_->backward(ctx, dresid, *mb.vision);
  if (embed_.trainable())
    ops::embedding_backward(ctx, {.tokens = T, .vocab = cfg_.vocab, .dim = d}, mb.ids, dresid,
                            embed_.grad);
  if (hooks_) hooks_->after_backward(0);
  mb.have_forward = false;
}

void Model::to_device(Device device) {
  if (device == params_.device()) return;
  params_.to_device(device);
  for (int u = 0; u < num_units(); ++u) rebind_unit(u);
  if (vision_) vision_->bind(params_);  // the tower and projector hold refs too
  slots_.clear();                       // re-made on the new device by the next forward
  scratch_ = Arena();
}

std::vector<std::string> Model::unit_prefixes(int unit) const {
  const int L = num_layers();
  MT_CHECK(unit >= 0 && unit <= L + 1, ValueError, "unit ", unit, " out of range [0, ", L + 1, "]");
  if (unit == 0) return {"model.embed_tokens."};
  if (unit == L + 1)
    return cfg_.tie_embeddings ? std::vector<std::string>{"model.norm."}
                               : std::vector<std::string>{"model.norm.", "lm_head."};
  return {layer_prefix(static_cast<size_t>(unit - 1))};
}

void Model::materialize_deferred(const std::function<bool(const Param&)>& whole) {
  bool any = false;
  for (const auto& p : params_.all()) {
    if (!is_placeholder(p->value) || !whole(*p)) continue;
    p->value = Tensor::zeros(p->value.shape(), p->value.dtype(), p->value.device());
    if (p->grad.defined()) p->grad.zero_();
    any = true;
  }
  if (!any) return;
  for (int u = 0; u < num_units(); ++u) rebind_unit(u);
  if (vision_) vision_->bind(params_);
}

void Model::rebind_unit(int unit) {
  const int L = num_layers();
  MT_CHECK(unit >= 0 && unit <= L + 1, ValueError, "unit ", unit, " out of range [0, ", L + 1, "]");
  if (unit_binds_.empty()) unit_binds_.assign(static_cast<size_t>(num_units()), 0);
  ++unit_binds_[static_cast<size_t>(unit)];
  auto ref = [&](const std::string& name) {
    Param& p = params_.at(name);
    return p.ref();
  };
  auto table = [&](const std::string& prefix) {
    ParamTable t;
    for (const auto& p : params_.all())
      if (p->name.compare(0, prefix.size(), prefix) == 0)
        t[p->name.substr(prefix.size())] = p->ref();
    return t;
  };
  if (unit == 0) {
    embed_ = ref("model.embed_tokens.weight");
    if (cfg_.tie_embeddings) lm_head_ = embed_;
  } else if (unit == L + 1) {
    final_norm_ = ref("model.norm.weight");
    lm_head_ = ref(cfg_.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  } else {
    const size_t i = static_cast<size_t>(unit - 1);
    const std::string p = layer_prefix(i);
    norm_in_[i] = ref(p + "input_layernorm.weight");
    norm_post_[i] = ref(p + "post_attention_layernorm.weight");
    mixers_[i]->bind(table(p + "self_attn."));
    pad_experts(i);
    ffns_[i]->bind(table(p + "mlp."));
  }
}

bool Model::pad_experts(size_t layer) {
  const auto* moe = dynamic_cast<const MoeLayer*>(ffns_.at(layer).get());
  if (moe == nullptr || moe->config().expert_lora.rank <= 0) return false;
  bool moved = false;
  for (const char* name : {"experts.gate_up_proj", "experts.down_proj"}) {
    Param& p = params_.at(layer_prefix(layer) + "mlp." + name);
    // A trained base stays dense: the optimizer and the sharded paths walk values as flat
    // buffers. A frozen one (expert LoRA's case) is only read, by the GEMMs and the loaders.
    if (p.trainable() || is_placeholder(p.value) ||
        !moe->pads_expert_weights(p.value.device(), p.value.dtype()))
      continue;
    Tensor padded = ops::grouped_ffn_pad_weight(p.value, moe->config().expert_lora.rank);
    moved = moved || padded.raw() != p.value.raw();
    p.value = std::move(padded);
  }
  return moved;
}

const std::vector<AuxLoss>& Model::aux_losses() const {
  std::vector<AuxLoss>& out = aux_read_;
  for (AuxLoss& o : out) o.value = 0;
  auto add = [&](const AuxTerm& a) {
    const double v = a.value.defined() ? read_scalar(a.value) : 0.0;
    for (AuxLoss& o : out)
      if (o.name == a.name) {
        o.value += v;
        return;
      }
    out.push_back({a.name, v, a.weight});  // the first read only: names are fixed per model
  };
  for (const auto& m : mixers_)
    for (const AuxTerm& a : m->aux_terms()) add(a);
  for (const auto& f : ffns_)
    for (const AuxTerm& a : f->aux_terms()) add(a);
  return out;
}

void Model::set_loss_weight(float ce, float seq_aux) {
  loss_weight_ = ce;
  // Over the layers themselves: moe_layers() builds a vector, and this runs in every step.
  for (auto& f : ffns_)
    if (auto* m = dynamic_cast<MoeLayer*>(f.get())) m->set_seq_aux_weight(seq_aux);
}

std::vector<MoeLayer*> Model::moe_layers() {
  std::vector<MoeLayer*> out;
  for (auto& f : ffns_) out.push_back(dynamic_cast<MoeLayer*>(f.get()));
  return out;
}

void Model::shard_experts(int64_t first, int64_t count,
                          const std::vector<ExpertCompute*>& computes) {
  size_t k = 0;
  for (size_t i = 0; i < ffns_.size(); ++i) {
    auto* moe = dynamic_cast<MoeLayer*>(ffns_[i].get());
    if (!moe) continue;
    MT_CHECK(k < computes.size(), ValueError, "shard_experts: ", computes.size(),
             " expert computes for more MoE layers");
    const std::string prefix = layer_prefix(i) + "mlp.";
    const std::string experts = prefix + "experts.";
    ParamTable table;
    for (const auto& p : params_.all()) {
      if (p->name.compare(0, prefix.size(), prefix) != 0) continue;
      if (p->name.compare(0, experts.size(), experts) == 0) {
        // Slice the leading expert dimension; the full tensors are released here.
        if (is_placeholder(p->value)) {
          std::vector<int64_t> d = p->value.shape().dims();
          d[0] = count;
          p->value = Tensor::zeros(Shape(d), p->value.dtype(), p->value.device());
        } else {
          p->value = p->value.rows(first, first + count).clone();
        }
        if (p->grad.defined())
          p->grad = Tensor::zeros(p->value.shape(), DType::F32, p->value.device());
      }
      table[p->name.substr(prefix.size())] = p->ref();
    }
    moe->set_local_experts(first, count, computes[k++]);
    moe->bind(table);
  }
  MT_CHECK(k == computes.size(), ValueError, "shard_experts: ", computes.size(),
           " expert computes for ", k, " MoE layers");
}

}  // namespace mt
