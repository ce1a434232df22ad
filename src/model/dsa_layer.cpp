#include "model/dsa_layer.h"

#include <cmath>

#include "ops/elementwise.h"
#include "ops/indexer.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace mt {

namespace {
MlaConfig checked_mla(const DsaConfig& cfg) {
  MT_CHECK(cfg.mla.q_lora_rank > 0, ConfigError,
           "dsa: the indexer reads the q latent, so q_lora_rank must be positive");
  MT_CHECK(cfg.index_heads > 0 && cfg.index_head_dim > 0, ConfigError, "dsa: index_heads ",
           cfg.index_heads, " and index_head_dim ", cfg.index_head_dim, " must be positive");
  MT_CHECK(cfg.index_rope_dim >= 0 && cfg.index_rope_dim % 2 == 0 &&
               cfg.index_rope_dim <= cfg.index_head_dim,
           ConfigError, "dsa: index_rope_dim ", cfg.index_rope_dim,
           " must be even and at most index_head_dim ", cfg.index_head_dim);
  MT_CHECK(cfg.dense_warmup || cfg.index_topk > 0, ConfigError, "dsa: index_topk ", cfg.index_topk,
           " must be positive");
  return cfg.mla;
}
}  // namespace

DsaLayer::DsaLayer(const DsaConfig& cfg) : MlaLayer(checked_mla(cfg)), dcfg_(cfg) {
  const int64_t HI = cfg.index_heads, DI = cfg.index_head_dim;
  wq_b_ = LinearModule("indexer.wq_b", cfg.mla.q_lora_rank, HI * DI, cfg.mla.lora);
  wk_ = LinearModule("indexer.wk", cfg.mla.hidden, DI, cfg.mla.lora);
  weights_proj_ = LinearModule("indexer.weights_proj", cfg.mla.hidden, HI, cfg.mla.lora);
  kl_ = {.name = "indexer_kl", .value = {}, .weight = cfg.indexer_loss_coeff};
  absorb_ = true;
}

float DsaLayer::weight_scale() const {
  return 1.f / std::sqrt(static_cast<float>(dcfg_.index_heads));
}

std::vector<ParamSpec> DsaLayer::param_specs() const {
  std::vector<ParamSpec> s = MlaLayer::param_specs();
  wq_b_.add_specs(s);
  wk_.add_specs(s);
  s.push_back(
      {.name = "indexer.k_norm.weight", .shape = {dcfg_.index_head_dim}, .init = ParamInit::Ones});
  s.push_back(
      {.name = "indexer.k_norm.bias", .shape = {dcfg_.index_head_dim}, .init = ParamInit::Zeros});
  weights_proj_.add_specs(s);
  return s;
}

void DsaLayer::bind(const ParamTable& params) {
  MlaLayer::bind(dcfg_.dense_warmup ? without_grads(params) : params);
  wq_b_.bind(params);
  wk_.bind(params);
  k_norm_w_ = need_param(params, "indexer.k_norm.weight", {dcfg_.index_head_dim});
  k_norm_b_ = need_param(params, "indexer.k_norm.bias", {dcfg_.index_head_dim});
  weights_proj_.bind(params);
}

int64_t DsaLayer::index_slots(const SeqInfo& seq) const {
  return dcfg_.dense_warmup ? ops::max_doc_len(seq) : dcfg_.index_topk;
}

// The top-k of a document no longer than index_topk is every causal key (DsaLayer's test
// TopkAtLeastTEqualsDenseMlaExactly).
bool DsaLayer::selects_every_key(const SeqInfo& seq) const {
  return dcfg_.dense_warmup || ops::max_doc_len(seq) <= dcfg_.index_topk;
}

void DsaLayer::plan_selection(const SeqInfo& seq, ArenaPlan& plan) const {
  const int64_t T = seq.tokens, HI = dcfg_.index_heads, DI = dcfg_.index_head_dim;
  plan.add({T, HI * DI});  // qi
  wq_b_.plan(T, plan);
  plan.add({T, DI});  // ki
  wk_.plan(T, plan);
  plan.add_fp32({T});  // k_mean
  plan.add_fp32({T});  // k_rstd
  plan.add({T, DI});   // kn
  plan.add({T, HI});   // wts
  weights_proj_.plan(T, plan);
  if (dcfg_.indexer_loss_coeff != 0.f) plan.add_fp32({T, index_slots(seq)});  // KL's dscores
}

ops::RopeParams DsaLayer::index_rope(int64_t tokens) const {
  return {.tokens = tokens,
          .heads = dcfg_.index_heads,
          .head_dim = dcfg_.index_head_dim,
          .rot_offset = 0,
          .rot_dim = dcfg_.index_rope_dim,
          .theta = cfg_.rope_theta,
          .style = ops::RopeStyle::HalfSplit,
          .scaling = cfg_.rope_scaling};
}

void DsaLayer::project_indexer(Context& ctx, const Tensor& x, const Tensor& cqn,
                               const Tensor& positions, Tensor& qi, Tensor& kn, Tensor& wts,
                               Arena& acts, Saved& s) const {
  const int64_t n = x.dim(0), HI = dcfg_.index_heads, DI = dcfg_.index_head_dim,
                R = dcfg_.index_rope_dim;
  wq_b_.forward(ctx, cqn, qi, acts, s.wq_b);
  s.ki = acts.alloc({n, DI}, x.dtype());
  wk_.forward(ctx, x, s.ki, acts, s.wk);
  s.k_mean = acts.alloc({n}, DType::F32);
  s.k_rstd = acts.alloc({n}, DType::F32);
  ops::layernorm_forward(ctx, {.rows = n, .dim = DI, .eps = dcfg_.indexer_norm_eps}, s.ki,
                         k_norm_w_.value, k_norm_b_.value, kn, s.k_mean, s.k_rstd);
  if (R > 0) {
    ops::RopeParams rp = index_rope(n);
    Tensor q3 = qi.view({n, HI, DI});
    ops::rope_forward(ctx, rp, positions, q3, q3);
    rp.heads = 1;
    Tensor k3 = kn.view({n, 1, DI});
    ops::rope_forward(ctx, rp, positions, k3, k3);
  }
  weights_proj_.forward(ctx, x, wts, acts, s.weights_proj);
  ops::scale(ctx, wts, weight_scale(), wts);
}

void DsaLayer::select_keys(Context& ctx, const SeqInfo& seq, const Tensor& x, Arena& acts,
                           MlaLayer::Saved& ms) {
  Saved& s = state_as<Saved>(ms, "dsa layer");
  selected_ = s.idx;
  const int64_t T = seq.tokens, HI = dcfg_.index_heads, DI = dcfg_.index_head_dim;
  const DType at = x.dtype();
  s.qi = acts.alloc({T, HI * DI}, at);
  s.kn = acts.alloc({T, DI}, at);
  s.wts = acts.alloc({T, HI}, at);
  project_indexer(ctx, x, s.cqn, seq.positions, s.qi, s.kn, s.wts, acts, s);

  if (dcfg_.dense_warmup) {
    ops::causal_indices(seq, s.idx);
    return;
  }
  ops::indexer_causal_topk(ctx, {.tokens = T, .heads = HI, .head_dim = DI}, seq,
                           s.qi.view({T, HI, DI}), s.kn, s.wts, dcfg_.index_topk, s.idx);
}

void DsaLayer::kl_target(Context& ctx, int64_t T, Saved& s, Tensor& target) const {
  const int64_t slots = s.idx.dim(1);
  if (s.absorbed)
    ops::sparse_mqa_prob_sum(ctx, mqa_params(T, slots), s.qa, s.kvl, s.idx, s.lse, target);
  else
    ops::attention_prob_sum(ctx, attn_params(T, slots), s.q, s.k, s.idx, s.lse, target);
}

void DsaLayer::indexer_kl(Context& ctx, int64_t T, Saved& s, const Tensor& target) {
  const int64_t HI = dcfg_.index_heads, DI = dcfg_.index_head_dim, slots = s.idx.dim(1);
  const float coeff = dcfg_.indexer_loss_coeff;
  // Scores, softmax, loss and gradient in one call: on the GPU one kernel per query row, with no
  // score or softmax table.
  Tensor none;
  ops::indexer_scores_kl(ctx, {.tokens = T, .heads = HI, .head_dim = DI, .kmax = slots},
                         s.qi.view({T, HI, DI}), s.kn, s.wts, s.idx, target, coeff, kl_.value,
                         coeff != 0.f ? s.dscores : none);
}

void DsaLayer::after_attention(Context& ctx, const SeqInfo& seq, Arena& acts, MlaLayer::Saved& ms) {
  Saved& s = state_as<Saved>(ms, "dsa layer");
  const int64_t T = seq.tokens, slots = s.idx.dim(1);
  // The KL's gradient into the scores, coeff (softmax - p) / T, depends on nothing backward
  // brings (the loss enters with its fixed coefficient), so it is saved alone: one [T, slots]
  // fp32 table instead of the target and the softmax (8 KiB a token less at top-2048).
  if (dcfg_.indexer_loss_coeff != 0.f) s.dscores = acts.alloc({T, slots}, DType::F32);
  ensure_scalar(kl_.value, ctx.device());
  s.prob_sum = Tensor();  // set by backward alone, for the call it makes
  s.kl_in_backward = s.backward_follows;
  if (s.kl_in_backward) return;
  ArenaScope scope(ctx.workspace());
  Tensor target = ctx.workspace().alloc({T, slots}, DType::F32);
  kl_target(ctx, T, s, target);
  indexer_kl(ctx, T, s, target);
}

void DsaLayer::backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                        LayerState& st) {
  Saved& s = state_as<Saved>(st, "dsa layer");
  const int64_t T = seq.tokens;
  if (s.kl_in_backward) {
    // The absorbed attention backward writes the target as it recomputes P (no pass of its own;
    // qa is rebuilt there). The per-head form's attention backward has no such output: its prob
    // sum runs as in forward, on the saved q and k, at the same cost as there.
    ArenaScope scope(ctx.workspace());
    Tensor target = ctx.workspace().alloc({T, s.idx.dim(1)}, DType::F32);
    if (s.absorbed)
      s.prob_sum = target;
    else
      kl_target(ctx, T, s, target);
    MlaLayer::backward(ctx, seq, dy, dx, st);
    s.prob_sum = Tensor();
    indexer_kl(ctx, T, s, target);
    s.kl_in_backward = false;
  } else {
    MlaLayer::backward(ctx, seq, dy, dx, st);
  }
  const float coeff = dcfg_.indexer_loss_coeff;
  if (coeff == 0.f) return;
  const int64_t HI = dcfg_.index_heads, DI = dcfg_.index_head_dim, R = dcfg_.index_rope_dim,
                slots = s.idx.dim(1);
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  const DType at = s.qi.dtype();
  Tensor dqi = ws.alloc({T, HI, DI}, at), dkn = ws.alloc({T, DI}, at), dw = ws.alloc({T, HI}, at);
  ops::indexer_scores_backward(ctx, {.tokens = T, .heads = HI, .head_dim = DI, .kmax = slots},
                               s.qi.view({T, HI, DI}), s.kn, s.wts, s.idx, s.dscores, dqi, dkn, dw);
  ops::scale(ctx, dw, weight_scale(), dw);
  // The indexer's inputs are detached: its projections get weight gradients only.
  Tensor none;
  weights_proj_.backward(ctx, s.weights_proj, dw, none);
  if (R > 0) {
    ops::RopeParams rp = index_rope(T);
    ops::rope_backward(ctx, rp, seq.positions, dqi, dqi);
    rp.heads = 1;
    Tensor k3 = dkn.view({T, 1, DI});
    ops::rope_backward(ctx, rp, seq.positions, k3, k3);
  }
  Tensor dki = ws.alloc({T, DI}, at);
  ops::layernorm_backward(ctx, {.rows = T, .dim = DI, .eps = dcfg_.indexer_norm_eps}, s.ki,
                          k_norm_w_.value, s.k_mean, s.k_rstd, dkn, dki, k_norm_w_.grad,
                          k_norm_b_.grad);
  wk_.backward(ctx, s.wk, dki, none);
  Tensor dq2 = dqi.view({T, HI * DI});
  wq_b_.backward(ctx, s.wq_b, dq2, none);
}

}  // namespace mt
