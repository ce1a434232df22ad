#include "model/mla_layer.h"

#include <cmath>

#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/sparse_mqa_attention.h"

namespace mt {

namespace {

Tensor w_uk(const MlaAbsorbDims& d, const Tensor& w, int64_t h) {
  const int64_t r = h * (d.nope + d.v_dim);
  return w.rows(r, r + d.nope);
}

Tensor w_uv(const MlaAbsorbDims& d, const Tensor& w, int64_t h) {
  const int64_t r = h * (d.nope + d.v_dim) + d.nope;
  return w.rows(r, r + d.v_dim);
}

}  // namespace

void mla_absorb_q(Context& ctx, const MlaAbsorbDims& d, const Tensor& w, const Tensor& q,
                  Tensor& qa) {
  const int64_t T = q.dim(0), H = d.heads, Dq = d.qk(), Da = d.latent(), kvr = d.kv_rank;
  const Tensor q2 = q.view({T, H * Dq});
  Tensor qa2 = qa.view({T, H * Da});
  for (int64_t h = 0; h < H; ++h) {
    Tensor qa_h = qa2.cols(h * Da, h * Da + kvr);
    ops::matmul(ctx, q2.cols(h * Dq, h * Dq + d.nope), false, w_uk(d, w, h), false, qa_h);
  }
  if (d.rope > 0) {
    Tensor pe = qa.cols(kvr, Da);
    ops::copy(ctx, q.cols(d.nope, Dq), pe);
  }
}

void mla_absorb_q_backward(Context& ctx, const MlaAbsorbDims& d, const Tensor& w, const Tensor& q,
                           const Tensor& dqa, Tensor& dq, Tensor& wgrad) {
  const int64_t T = q.dim(0), H = d.heads, Dq = d.qk(), Da = d.latent(), kvr = d.kv_rank;
  const Tensor dqa2 = dqa.view({T, H * Da}), q2 = q.view({T, H * Dq});
  Tensor dq2 = dq.view({T, H * Dq});
  for (int64_t h = 0; h < H; ++h) {
    const Tensor dqa_h = dqa2.cols(h * Da, h * Da + kvr);
    Tensor dq_h = dq2.cols(h * Dq, h * Dq + d.nope);
    ops::matmul(ctx, dqa_h, false, w_uk(d, w, h), true, dq_h);
    if (wgrad.defined()) {
      Tensor g = w_uk(d, wgrad, h);
      ops::matmul(ctx, q2.cols(h * Dq, h * Dq + d.nope), true, dqa_h, false, g, 1.f, 1.f);
    }
  }
  if (d.rope > 0) {
    Tensor pe = dq.cols(d.nope, Dq);
    ops::copy(ctx, dqa.cols(kvr, Da), pe);
  }
}

void mla_expand_o(Context& ctx, const MlaAbsorbDims& d, const Tensor& w, const Tensor& ol,
                  Tensor& o) {
  const int64_t T = ol.dim(0), H = d.heads, Dv = d.v_dim, kvr = d.kv_rank;
  const Tensor ol2 = ol.view({T, H * kvr});
  Tensor o2 = o.view({T, H * Dv});
  for (int64_t h = 0; h < H; ++h) {
    Tensor o_h = o2.cols(h * Dv, (h + 1) * Dv);
    ops::matmul(ctx, ol2.cols(h * kvr, (h + 1) * kvr), false, w_uv(d, w, h), true, o_h);
  }
}

void mla_expand_o_backward(Context& ctx, const MlaAbsorbDims& d, const Tensor& w, const Tensor& ol,
                           const Tensor& dout, Tensor& dol, Tensor& wgrad) {
  const int64_t T = ol.dim(0), H = d.heads, Dv = d.v_dim, kvr = d.kv_rank;
  const Tensor dout2 = dout.view({T, H * Dv}), ol2 = ol.view({T, H * kvr});
  Tensor dol2 = dol.view({T, H * kvr});
  for (int64_t h = 0; h < H; ++h) {
    const Tensor dout_h = dout2.cols(h * Dv, (h + 1) * Dv);
    Tensor dol_h = dol2.cols(h * kvr, (h + 1) * kvr);
    ops::matmul(ctx, dout_h, false, w_uv(d, w, h), false, dol_h);
    if (wgrad.defined()) {
      Tensor g = w_uv(d, wgrad, h);
      ops::matmul(ctx, dout_h, true, ol2.cols(h * kvr, (h + 1) * kvr), false, g, 1.f, 1.f);
    }
  }
}

MlaLayer::MlaLayer(const MlaConfig& cfg) : cfg_(cfg) {
  MT_CHECK(cfg.hidden > 0 && cfg.heads > 0 && cfg.kv_lora_rank > 0 && cfg.v_head_dim > 0 &&
               cfg.qk_nope_dim >= 0 && cfg.qk_rope_dim >= 0 && cfg.q_lora_rank >= 0,
           ConfigError, "mla: hidden ", cfg.hidden, " heads ", cfg.heads, " kv_lora_rank ",
           cfg.kv_lora_rank, " v_head_dim ", cfg.v_head_dim, " must be positive");
  MT_CHECK(qk_dim() > 0, ConfigError, "mla: qk_nope_dim + qk_rope_dim must be positive");
  MT_CHECK(cfg.qk_rope_dim % 2 == 0, ConfigError, "mla: qk_rope_dim ", cfg.qk_rope_dim,
           " must be even");
  const int64_t d = cfg.hidden, H = cfg.heads;
  if (cfg.q_lora_rank > 0) {
    q_a_ = LinearModule("q_a_proj", d, cfg.q_lora_rank, cfg.lora);
    q_b_ = LinearModule("q_b_proj", cfg.q_lora_rank, H * qk_dim(), cfg.lora);
  } else {
    q_proj_ = LinearModule("q_proj", d, H * qk_dim(), cfg.lora);
  }
  kv_a_ = LinearModule("kv_a_proj_with_mqa", d, cfg.kv_lora_rank + cfg.qk_rope_dim, cfg.lora);
  kv_b_ =
      LinearModule("kv_b_proj", cfg.kv_lora_rank, H * (cfg.qk_nope_dim + cfg.v_head_dim), cfg.lora);
  o_proj_ = LinearModule("o_proj", H * cfg.v_head_dim, d, cfg.lora);
  if (cfg.output_gate) g_proj_ = LinearModule("g_proj", d, H * cfg.v_head_dim, cfg.lora);
}

float MlaLayer::softmax_scale() const {
  return cfg_.softmax_scale > 0 ? cfg_.softmax_scale
                                : 1.f / std::sqrt(static_cast<float>(qk_dim()));
}

std::vector<ParamSpec> MlaLayer::param_specs() const {
  std::vector<ParamSpec> s;
  if (cfg_.q_lora_rank > 0) {
    q_a_.add_specs(s);
    s.push_back(
        {.name = "q_a_layernorm.weight", .shape = {cfg_.q_lora_rank}, .init = ParamInit::Ones});
    q_b_.add_specs(s);
  } else {
    q_proj_.add_specs(s);
  }
  kv_a_.add_specs(s);
  s.push_back(
      {.name = "kv_a_layernorm.weight", .shape = {cfg_.kv_lora_rank}, .init = ParamInit::Ones});
  kv_b_.add_specs(s);
  o_proj_.add_specs(s);
  if (cfg_.output_gate) g_proj_.add_specs(s);
  return s;
}

void MlaLayer::bind(const ParamTable& params) {
  if (cfg_.q_lora_rank > 0) {
    q_a_.bind(params);
    q_norm_ = need_param(params, "q_a_layernorm.weight", {cfg_.q_lora_rank});
    q_b_.bind(params);
  } else {
    q_proj_.bind(params);
  }
  kv_a_.bind(params);
  kv_norm_ = need_param(params, "kv_a_layernorm.weight", {cfg_.kv_lora_rank});
  kv_b_.bind(params);
  const int64_t kv_out = cfg_.heads * (cfg_.qk_nope_dim + cfg_.v_head_dim);
  kv_b_w_ = need_param(params, "kv_b_proj.weight", {kv_out, cfg_.kv_lora_rank});
  if (cfg_.lora.rank > 0) {
    kv_b_a_ = need_param(params, "kv_b_proj.lora_A.weight", {cfg_.lora.rank, cfg_.kv_lora_rank});
    kv_b_b_ = need_param(params, "kv_b_proj.lora_B.weight", {kv_out, cfg_.lora.rank});
  }
  o_proj_.bind(params);
  if (cfg_.output_gate) g_proj_.bind(params);
}

ParamTable MlaLayer::without_grads(const ParamTable& params) {
  ParamTable t = params;
  for (auto& [name, ref] : t) ref.grad = Tensor();
  return t;
}

int64_t MlaLayer::index_slots(const SeqInfo&) const {
  return 0;
}

bool MlaLayer::selects_every_key(const SeqInfo&) const {
  return false;
}

void MlaLayer::plan_selection(const SeqInfo&, ArenaPlan&) const {}

void MlaLayer::select_keys(Context&, const SeqInfo&, const Tensor&, Arena&, Saved&) {}

void MlaLayer::after_attention(Context&, const SeqInfo&, Arena&, Saved&) {}

ops::RopeParams MlaLayer::q_rope(int64_t tokens) const {
  return {.tokens = tokens,
          .heads = cfg_.heads,
          .head_dim = qk_dim(),
          .rot_offset = cfg_.qk_nope_dim,
          .rot_dim = cfg_.qk_rope_dim,
          .theta = cfg_.rope_theta,
          .style = cfg_.rope_style,
          .scaling = cfg_.rope_scaling};
}

ops::RopeParams MlaLayer::k_rope(int64_t tokens) const {
  ops::RopeParams p = q_rope(tokens);
  p.heads = 1;
  p.head_dim = cfg_.qk_rope_dim;
  p.rot_offset = 0;
  return p;
}

ops::SparseMqaParams MlaLayer::mqa_params(int64_t tokens, int64_t slots) const {
  return {.tokens = tokens,
          .heads = cfg_.heads,
          .qk_dim = cfg_.kv_lora_rank + cfg_.qk_rope_dim,
          .v_dim = cfg_.kv_lora_rank,
          .kmax = slots,
          .scale = softmax_scale()};
}

MlaAbsorbDims MlaLayer::absorb_dims() const {
  return {.heads = cfg_.heads,
          .nope = cfg_.qk_nope_dim,
          .rope = cfg_.qk_rope_dim,
          .v_dim = cfg_.v_head_dim,
          .kv_rank = cfg_.kv_lora_rank};
}

ops::AttentionParams MlaLayer::attn_params(int64_t tokens, int64_t slots) const {
  return {.tokens = tokens,
          .heads = cfg_.heads,
          .kv_heads = cfg_.heads,
          .qk_dim = qk_dim(),
          .v_dim = cfg_.v_head_dim,
          .kmax = slots,
          .scale = softmax_scale()};
}

bool MlaLayer::absorbs(const SeqInfo& seq) const {
  return absorb_ && cfg_.qk_nope_dim > 0 && index_slots(seq) > 0 && !selects_every_key(seq);
}

float MlaLayer::kv_b_lora_scale() const {
  return cfg_.lora.alpha / static_cast<float>(cfg_.lora.rank);
}

Tensor MlaLayer::absorb_weight(Context& ctx) const {
  if (cfg_.lora.rank == 0) return kv_b_w_.value;
  Tensor w = ctx.workspace().alloc(kv_b_w_.value.shape(), kv_b_w_.value.dtype());
  ops::copy(ctx, kv_b_w_.value, w);
  ops::matmul(ctx, kv_b_b_.value, false, kv_b_a_.value, false, w, kv_b_lora_scale(), 1.f);
  return w;
}

void MlaLayer::plan_activations(const SeqInfo& seq, ArenaPlan& plan) const {
  const int64_t T = seq.tokens, H = cfg_.heads, Dv = cfg_.v_head_dim;
  // Same order as forward allocates.
  if (cfg_.q_lora_rank > 0) {
    plan.add({T, cfg_.q_lora_rank});  // cq
    q_a_.plan(T, plan);
    plan.add_fp32({T});               // q_rstd
    plan.add({T, cfg_.q_lora_rank});  // cqn
    q_b_.plan(T, plan);
  } else {
    q_proj_.plan(T, plan);
  }
  plan.add({T, H, qk_dim()});  // q
  kv_a_.plan(T, plan);
  plan.add({T, cfg_.kv_lora_rank});  // c
  plan.add_fp32({T});                // kv_rstd
  plan.add({T, cfg_.kv_lora_rank});  // cn
  const bool absorbed = absorbs(seq);
  const int64_t kvr = cfg_.kv_lora_rank, Da = kvr + cfg_.qk_rope_dim;
  if (absorbed) {
    plan.add({T, Da});  // kvl, in place of kv_b_proj's output k, v
  } else {
    kv_b_.plan(T, plan);
    plan.add({T, H, qk_dim()});  // k
    plan.add({T, H, Dv});        // v
  }
  if (index_slots(seq) > 0) {
    plan.add({T, index_slots(seq)}, DType::I32);
    plan_selection(seq, plan);
  }
  if (absorbed) plan.add({T, H, kvr});  // ol (qa lives in the workspace)
  plan.add({T, H, Dv});                 // o
  plan.add_fp32({T, H});                // lse
  if (cfg_.output_gate) {
    plan.add({T, H * Dv});  // g
    g_proj_.plan(T, plan);
    plan.add({T, H * Dv});  // og
  }
  o_proj_.plan(T, plan);
}

void MlaLayer::project_q(Context& ctx, const Tensor& x, const Tensor& positions, Tensor& q,
                         Arena& acts, Saved& s) const {
  const int64_t n = x.dim(0), H = cfg_.heads, Dqk = qk_dim(), rope = cfg_.qk_rope_dim;
  Tensor q2 = q.view({n, H * Dqk});
  if (cfg_.q_lora_rank > 0) {
    s.cq = acts.alloc({n, cfg_.q_lora_rank}, x.dtype());
    q_a_.forward(ctx, x, s.cq, acts, s.q_a);
    s.q_rstd = acts.alloc({n}, DType::F32);
    s.cqn = acts.alloc({n, cfg_.q_lora_rank}, x.dtype());
    ops::rmsnorm_forward(ctx, {.rows = n, .dim = cfg_.q_lora_rank, .eps = cfg_.norm_eps}, s.cq,
                         q_norm_.value, s.cqn, s.q_rstd);
    q_b_.forward(ctx, s.cqn, q2, acts, s.q_b);
  } else {
    q_proj_.forward(ctx, x, q2, acts, s.q_proj);
  }
  if (cfg_.use_rope && rope > 0) ops::rope_forward(ctx, q_rope(n), positions, q, q);
}

void MlaLayer::project_latent(Context& ctx, const Tensor& x, const Tensor& positions, Tensor& kpe,
                              Arena& acts, Saved& s) const {
  const int64_t n = x.dim(0), rope = cfg_.qk_rope_dim, kvr = cfg_.kv_lora_rank;
  ArenaScope scope(ctx.workspace());
  const DType at = x.dtype();
  Tensor ckv = ctx.workspace().alloc({n, kvr + rope}, at);
  kv_a_.forward(ctx, x, ckv, acts, s.kv_a);
  s.c = acts.alloc({n, kvr}, at);
  // The norm and RoPE need dense rows, so the two parts of the fused latent are copied out.
  ops::copy(ctx, ckv.cols(0, kvr), s.c);
  Tensor kpe2 = kpe.view({n, rope});
  ops::copy(ctx, ckv.cols(kvr, kvr + rope), kpe2);
  s.kv_rstd = acts.alloc({n}, DType::F32);
  s.cn = acts.alloc({n, kvr}, at);
  ops::rmsnorm_forward(ctx, {.rows = n, .dim = kvr, .eps = cfg_.norm_eps}, s.c, kv_norm_.value,
                       s.cn, s.kv_rstd);
  if (cfg_.use_rope && rope > 0) ops::rope_forward(ctx, k_rope(n), positions, kpe, kpe);
}

void MlaLayer::project_kv(Context& ctx, const Tensor& x, const Tensor& positions, Tensor& k,
                          Tensor& v, Arena& acts, Saved& s) const {
  const int64_t n = x.dim(0), H = cfg_.heads, Dqk = qk_dim(), nope = cfg_.qk_nope_dim,
                rope = cfg_.qk_rope_dim, Dv = cfg_.v_head_dim;
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  const DType at = x.dtype();
  Tensor kpe = ws.alloc({n, 1, rope}, at);
  Tensor kpe2 = kpe.view({n, rope});
  project_latent(ctx, x, positions, kpe, acts, s);
  Tensor kv = ws.alloc({n, H * (nope + Dv)}, at);
  kv_b_.forward(ctx, s.cn, kv, acts, s.kv_b);
  // k = [k_nope | the shared rotary key on every head], v: column views of kv_b's output.
  const Tensor kv3 = kv.view({n, H, nope + Dv});
  Tensor k_nope = k.cols(0, nope), k_rot = k.cols(nope, Dqk);
  ops::copy(ctx, kv3.cols(0, nope), k_nope);
  ops::expand_heads_forward(ctx, kpe2, k_rot);
  ops::copy(ctx, kv3.cols(nope, nope + Dv), v);
}

void MlaLayer::project_out(Context& ctx, const Tensor& x, const Tensor& o, Tensor& y, Arena& acts,
                           Saved& s) const {
  if (cfg_.output_gate) {
    s.g = acts.alloc(o.shape(), o.dtype());
    g_proj_.forward(ctx, x, s.g, acts, s.g_proj);
    s.og = acts.alloc(o.shape(), o.dtype());
    ops::sigmoid_gate_forward(ctx, o, s.g, s.og);
    o_proj_.forward(ctx, s.og, y, acts, s.o_proj);
  } else {
    o_proj_.forward(ctx, o, y, acts, s.o_proj);
  }
}

void MlaLayer::forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
                       LayerState& st) {
  Saved& s = state_as<Saved>(st, "mla layer");
  const int64_t T = seq.tokens, d = cfg_.hidden, H = cfg_.heads, Dqk = qk_dim(),
                Dv = cfg_.v_head_dim;
  expect_shape(x, {T, d}, "mla x");
  expect_shape(y, {T, d}, "mla y");
  s.x = x;
  const DType at = x.dtype();
  s.q = acts.alloc({T, H, Dqk}, at);
  project_q(ctx, x, seq.positions, s.q, acts, s);
  s.absorbed = absorbs(seq);
  if (s.absorbed) {
    // The absorbed attention reads only the shared latent entries [c_norm ; k_pe]: per-head k
    // and v ([T, H, Dqk + Dv], 17.8x the entries' width at DeepSeek's shapes) are never formed.
    const int64_t kvr = cfg_.kv_lora_rank, Da = kvr + cfg_.qk_rope_dim;
    s.k = s.v = Tensor();
    s.kvl = acts.alloc({T, Da}, at);
    ArenaScope scope(ctx.workspace());
    Tensor kpe = ctx.workspace().alloc({T, 1, cfg_.qk_rope_dim}, at);
    project_latent(ctx, x, seq.positions, kpe, acts, s);
    Tensor lat = s.kvl.cols(0, kvr), pe = s.kvl.cols(kvr, Da);
    ops::copy(ctx, s.cn, lat);
    if (cfg_.qk_rope_dim > 0) ops::copy(ctx, kpe.view({T, cfg_.qk_rope_dim}), pe);
  } else {
    s.k = acts.alloc({T, H, Dqk}, at);
    s.v = acts.alloc({T, H, Dv}, at);
    project_kv(ctx, x, seq.positions, s.k, s.v, acts, s);
  }

  // Attention: over the selected keys, or dense causal inside each document.
  const int64_t slots = index_slots(seq);
  if (slots > 0) {
    s.idx = acts.alloc({T, slots}, DType::I32);
    select_keys(ctx, seq, x, acts, s);
  } else {
    s.idx = Tensor();
  }
  s.o = acts.alloc({T, H, Dv}, at);
  s.lse = acts.alloc({T, H}, DType::F32);
  s.dense = slots == 0 || selects_every_key(seq);
  {
    // The absorbed form's qa lives in the workspace until after_attention has read it; backward
    // rebuilds it (absorbed_backward).
    ArenaScope scope(ctx.workspace());
    if (s.dense)
      ops::causal_attention_forward(ctx, attn_params(T, 0), seq.cu_seqlens, s.q, s.k, s.v, s.o,
                                    s.lse);
    else if (s.absorbed)
      absorbed_forward(ctx, T, acts, s);
    else
      ops::attention_forward(ctx, attn_params(T, slots), s.q, s.k, s.v, s.idx, s.o, s.lse);
    if (slots > 0) after_attention(ctx, seq, acts, s);
    s.qa = Tensor();
  }
  project_out(ctx, x, s.o.view({T, H * Dv}), y, acts, s);
}

void MlaLayer::absorbed_forward(Context& ctx, int64_t T, Arena& acts, Saved& s) const {
  const MlaAbsorbDims d = absorb_dims();
  const int64_t H = cfg_.heads, kvr = d.kv_rank, Da = d.latent();
  const DType at = s.q.dtype();
  s.qa = ctx.workspace().alloc({T, H, Da}, at);  // the caller's scope: read by after_attention
  s.ol = acts.alloc({T, H, kvr}, at);
  ArenaScope scope(ctx.workspace());
  const Tensor w = absorb_weight(ctx);
  mla_absorb_q(ctx, d, w, s.q, s.qa);
  ops::sparse_mqa_forward(ctx, mqa_params(T, s.idx.dim(1)), s.qa, s.kvl, s.idx, s.ol, s.lse);
  mla_expand_o(ctx, d, w, s.ol, s.o);
}

void MlaLayer::absorbed_backward(Context& ctx, const Saved& s, const Tensor& dout, Tensor& dq,
                                 Tensor& dcn, Tensor& dkpe) {
  const MlaAbsorbDims d = absorb_dims();
  const int64_t T = s.q.dim(0), H = cfg_.heads, kvr = d.kv_rank, Da = d.latent();
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  const DType at = s.q.dtype();
  Tensor dol = ws.alloc({T, H, kvr}, at), dqa = ws.alloc({T, H, Da}, at),
         dkvl = ws.alloc({T, Da}, at), qa = ws.alloc({T, H, Da}, at);
  const Tensor w = absorb_weight(ctx);
  // qa is not saved ([T, H, kvr + rope], the widest activation of the form: 36 KiB a token at
  // DeepSeek's shapes); rebuilding it costs H products of T x nope x kvr, 2 T H nope kvr FLOPs
  // (0.3 TFLOP at T65536, 32 heads), well under the attention backward's.
  mla_absorb_q(ctx, d, w, s.q, qa);
  const bool lora = cfg_.lora.rank > 0;
  // Without an adapter dW_UK, dW_UV go straight into W's gradient (undefined when frozen: none);
  // with one, into dW_eff, which the adapter (and a training base) read below.
  Tensor wgrad = kv_b_w_.grad;
  if (lora) {
    wgrad = Tensor();
    if (kv_b_w_.grad.defined() || kv_b_a_.grad.defined() || kv_b_b_.grad.defined()) {
      wgrad = ws.alloc(w.shape(), DType::F32);
      wgrad.zero_();
    }
  }
  mla_expand_o_backward(ctx, d, w, s.ol, dout, dol, wgrad);
  Tensor prob_sum = s.prob_sum;
  ops::sparse_mqa_backward(ctx, mqa_params(T, s.idx.dim(1)), qa, s.kvl, s.idx, s.ol, s.lse, dol,
                           dqa, dkvl, prob_sum);
  mla_absorb_q_backward(ctx, d, w, s.q, dqa, dq, wgrad);
  if (lora && wgrad.defined()) lora_grads_from(ctx, wgrad);
  if (d.rope > 0) ops::copy(ctx, dkvl.cols(kvr, Da), dkpe);
  ops::copy(ctx, dkvl.cols(0, kvr), dcn);
}

void MlaLayer::lora_grads_from(Context& ctx, const Tensor& dw_eff) {
  if (kv_b_w_.grad.defined()) ops::add_into(ctx, dw_eff, kv_b_w_.grad);
  // The GEMMs take operands of one dtype: bf16 adapters are widened to match the fp32 dW_eff
  // ([O, r] and [r, kvr], small).
  auto as_f32 = [&](const Tensor& t) {
    if (t.dtype() == DType::F32) return t;
    Tensor f = ctx.workspace().alloc(t.shape(), DType::F32);
    ops::copy(ctx, t, f);
    return f;
  };
  const float sc = kv_b_lora_scale();
  if (kv_b_a_.grad.defined())
    ops::matmul(ctx, as_f32(kv_b_b_.value), true, dw_eff, false, kv_b_a_.grad, sc, 1.f);
  if (kv_b_b_.grad.defined())
    ops::matmul(ctx, dw_eff, false, as_f32(kv_b_a_.value), true, kv_b_b_.grad, sc, 1.f);
}

void MlaLayer::per_head_backward(Context& ctx, const SeqInfo& seq, const Saved& s,
                                 const Tensor& dout, Tensor& dq, Tensor& dcn, Tensor& dkpe) {
  const int64_t T = seq.tokens, H = cfg_.heads, Dqk = qk_dim(), nope = cfg_.qk_nope_dim,
                Dv = cfg_.v_head_dim;
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  const DType at = s.q.dtype();
  Tensor dk = ws.alloc({T, H, Dqk}, at), dv = ws.alloc({T, H, Dv}, at);
  if (s.dense)
    ops::causal_attention_backward(ctx, attn_params(T, 0), seq.cu_seqlens, s.q, s.k, s.v, s.o,
                                   s.lse, dout, dq, dk, dv);
  else
    ops::attention_backward(ctx, attn_params(T, s.idx.dim(1)), s.q, s.k, s.v, s.idx, s.o, s.lse,
                            dout, dq, dk, dv);
  // Keys/values back to the latent: per-head parts to kv_b, the shared rotary key summed.
  Tensor dkv = ws.alloc({T, H * (nope + Dv)}, at);
  {
    Tensor dkv3 = dkv.view({T, H, nope + Dv});
    Tensor dk_nope = dkv3.cols(0, nope), dv_part = dkv3.cols(nope, nope + Dv);
    ops::copy(ctx, dk.cols(0, nope), dk_nope);
    ops::copy(ctx, dv, dv_part);
    ops::expand_heads_backward(ctx, dk.cols(nope, Dqk), dkpe);
  }
  kv_b_.backward(ctx, s.kv_b, dkv, dcn);
}

void MlaLayer::backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                        LayerState& st) {
  Saved& s = state_as<Saved>(st, "mla layer");
  const int64_t T = seq.tokens, d = cfg_.hidden, H = cfg_.heads, Dqk = qk_dim(),
                rope = cfg_.qk_rope_dim, Dv = cfg_.v_head_dim, kvr = cfg_.kv_lora_rank;
  expect_shape(dy, {T, d}, "mla dy");
  expect_shape(dx, {T, d}, "mla dx");
  MT_CHECK(s.q.defined() && s.q.dim(0) == T, InternalError,
           "mla backward without a matching forward");
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  const DType at = s.q.dtype();
  bool dx_written = false;

  // Output projection and gate.
  Tensor dout = ws.alloc({T, H, Dv}, at);
  Tensor dout2 = dout.view({T, H * Dv});
  if (cfg_.output_gate) {
    Tensor dog = ws.alloc({T, H * Dv}, at);
    o_proj_.backward(ctx, s.o_proj, dy, dog);
    Tensor dg = ws.alloc({T, H * Dv}, at);
    // Attention's Delta must use the ungated gradient, which is what dout is.
    ops::sigmoid_gate_backward(ctx, s.o.view({T, H * Dv}), s.g, dog, dout2, dg);
    g_proj_.backward(ctx, s.g_proj, dg, dx);
    dx_written = true;
  } else {
    o_proj_.backward(ctx, s.o_proj, dy, dout2);
  }

  // Attention, and the keys back to the latent: the normed latent's dcn, the rotary key's dkpe.
  Tensor dq = ws.alloc({T, H, Dqk}, at), dcn = ws.alloc({T, kvr}, at);
  Tensor dckv = ws.alloc({T, kvr + rope}, at);
  Tensor dkpe = ws.alloc({T, 1, rope}, at);
  Tensor dkpe2 = dkpe.view({T, rope});
  if (s.absorbed)
    absorbed_backward(ctx, s, dout, dq, dcn, dkpe2);
  else
    per_head_backward(ctx, seq, s, dout, dq, dcn, dkpe2);
  const bool rotate = cfg_.use_rope && rope > 0;
  if (rotate) ops::rope_backward(ctx, k_rope(T), seq.positions, dkpe, dkpe);
  {
    Tensor part = dckv.cols(kvr, kvr + rope);
    ops::copy(ctx, dkpe2, part);
  }
  Tensor dc = ws.alloc({T, kvr}, at);
  ops::rmsnorm_backward(ctx, {.rows = T, .dim = kvr, .eps = cfg_.norm_eps}, s.c, kv_norm_.value,
                        s.kv_rstd, dcn, dc, kv_norm_.grad);
  {
    Tensor part = dckv.cols(0, kvr);
    ops::copy(ctx, dc, part);
  }
  kv_a_.backward(ctx, s.kv_a, dckv, dx, dx_written);
  dx_written = true;

  // Queries.
  if (rotate) ops::rope_backward(ctx, q_rope(T), seq.positions, dq, dq);
  Tensor dq2 = dq.view({T, H * Dqk});
  if (cfg_.q_lora_rank > 0) {
    Tensor dcqn = ws.alloc({T, cfg_.q_lora_rank}, at);
    q_b_.backward(ctx, s.q_b, dq2, dcqn);
    Tensor dcq = ws.alloc({T, cfg_.q_lora_rank}, at);
    ops::rmsnorm_backward(ctx, {.rows = T, .dim = cfg_.q_lora_rank, .eps = cfg_.norm_eps}, s.cq,
                          q_norm_.value, s.q_rstd, dcqn, dcq, q_norm_.grad);
    q_a_.backward(ctx, s.q_a, dcq, dx, true);
  } else {
    q_proj_.backward(ctx, s.q_proj, dq2, dx, true);
  }
}

}  // namespace mt
