#include "model/moe_layer.h"

#include <algorithm>

#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/expert_load.h"
#include "ops/gemm.h"
#include "ops/moe_dispatch.h"
#include "ops/moe_rules.h"

namespace mt {

namespace {

constexpr float kInitStd = 0.02f;

}  // namespace

MoeLayer::MoeLayer(const MoeConfig& cfg) : cfg_(cfg) {
  MT_CHECK(cfg.hidden > 0 && cfg.latent > 0 && cfg.latent <= cfg.hidden, ConfigError,
           "moe: latent ", cfg.latent, " must be in (0, hidden ", cfg.hidden, "]");
  const std::string routing =
      ops::routing_error(cfg.num_experts, cfg.top_k, cfg.n_group, cfg.topk_group);
  MT_CHECK(routing.empty(), ConfigError, "moe: ", routing);
  MT_CHECK(cfg.expert_ffn > 0, ConfigError, "moe: expert_ffn ", cfg.expert_ffn);
  MT_CHECK(cfg.num_shared >= 0 && (cfg.num_shared == 0 || cfg.shared_ffn > 0), ConfigError,
           "moe: ", cfg.num_shared, " shared experts of width ", cfg.shared_ffn);
  MT_CHECK(cfg.expert_lora.rank >= 0, ConfigError, "moe: expert LoRA rank ", cfg.expert_lora.rank);
  if (has_latent()) {
    latent_down_ = LinearModule("latent_down_proj", cfg.hidden, cfg.latent, cfg.lora, kInitStd);
    latent_up_ = LinearModule("latent_up_proj", cfg.latent, cfg.hidden, cfg.lora, kInitStd);
  }
  if (cfg.num_shared > 0) {
    const int64_t S = shared_width();
    shared_gate_ = LinearModule("shared_experts.gate_proj", cfg.hidden, S, cfg.lora, kInitStd);
    shared_up_ = LinearModule("shared_experts.up_proj", cfg.hidden, S, cfg.lora, kInitStd);
    shared_down_ = LinearModule("shared_experts.down_proj", S, cfg.hidden, cfg.lora, kInitStd);
  }
  load_.assign(static_cast<size_t>(cfg.num_experts), 0);
  load_t_ = Tensor::zeros({cfg.num_experts}, DType::I64);
  expert_count_ = cfg.num_experts;
  aux_[0] = {.name = "router_seq_aux", .value = {}, .weight = cfg.seq_aux_coeff};
  aux_[1] = {.name = "router_z", .value = {}, .weight = cfg.z_loss_coeff};
}

bool MoeLayer::pads_expert_weights(Device device, DType dtype) const {
  return remote_ == nullptr && ops::grouped_ffn_kconcat(ffn_params(1), device, dtype);
}

ops::GroupedFfnParams MoeLayer::ffn_params(int64_t tokens, Device device, DType at) const {
  ops::GroupedFfnParams p = ffn_params(tokens);
  p.padded_rows = pads_expert_weights(device, at);
  return p;
}

void MoeLayer::set_local_experts(int64_t first, int64_t count, ExpertCompute* compute) {
  MT_CHECK(first >= 0 && count > 0 && first + count <= cfg_.num_experts, ValueError,
           "local experts [", first, ", ", first + count, ") of ", cfg_.num_experts);
  MT_CHECK(compute != nullptr || count == cfg_.num_experts, ValueError, "a layer holding ", count,
           " of ", cfg_.num_experts, " experts needs an ExpertCompute");
  expert_first_ = first;
  expert_count_ = count;
  remote_ = compute;
}

void MoeLayer::set_expert_slots(std::vector<int32_t> slot_of) {
  const int64_t E = cfg_.num_experts;
  if (slot_of.empty()) {
    slot_of_.clear();
    expert_at_.clear();
    slot_of_t_ = expert_at_t_ = Tensor();
    return;
  }
  MT_CHECK(static_cast<int64_t>(slot_of.size()) == E, ValueError, "expert slots: ", slot_of.size(),
           " entries for ", E, " experts");
  std::vector<int32_t> at(static_cast<size_t>(E), -1);
  for (int64_t e = 0; e < E; ++e) {
    const int32_t s = slot_of[static_cast<size_t>(e)];
    MT_CHECK(s >= 0 && s < E && at[static_cast<size_t>(s)] < 0, ValueError,
             "expert slots: not a permutation (expert ", e, " -> slot ", s, ")");
    at[static_cast<size_t>(s)] = static_cast<int32_t>(e);
  }
  slot_of_ = std::move(slot_of);
  expert_at_ = std::move(at);
  slot_of_t_ = expert_at_t_ = Tensor();  // re-staged on the step's device at the next forward
}

void MoeLayer::set_overflow_policy(const ops::OverflowParams& p, std::vector<int32_t> expert_rank) {
  MT_CHECK(p.extra >= 0 && cfg_.top_k + p.extra <= cfg_.num_experts, ConfigError,
           "moe overflow policy: top_k ", cfg_.top_k, " + ", p.extra, " extra candidates of ",
           cfg_.num_experts, " experts");
  MT_CHECK(static_cast<int64_t>(expert_rank.size()) == cfg_.num_experts, ConfigError,
           "moe overflow policy: expert_rank has ", expert_rank.size(), " entries for ",
           cfg_.num_experts, " experts");
  overflow_ = p;
  overflow_rank_ = std::move(expert_rank);
  overflow_on_ = true;
}

void MoeLayer::set_trace_width(int64_t width) {
  MT_CHECK(width >= 0 && width <= cfg_.num_experts && (width == 0 || width >= cfg_.top_k),
           ConfigError, "moe routing trace width ", width, " must be 0 or in [top_k ", cfg_.top_k,
           ", ", cfg_.num_experts, "]");
  trace_width_ = width;
  if (width == 0) {
    trace_cand_.clear();
    trace_prio_.clear();
  }
}

ops::RouterParams MoeLayer::router_params(int64_t tokens) const {
  return {.tokens = tokens,
          .experts = cfg_.num_experts,
          .top_k = cfg_.top_k,
          .score = cfg_.score == RouterScore::Softmax ? ops::ScoreFunc::Softmax
                                                      : ops::ScoreFunc::Sigmoid,
          .n_group = cfg_.n_group,
          .topk_group = cfg_.topk_group,
          .norm_topk_prob = cfg_.norm_topk_prob,
          .routed_scaling = cfg_.routed_scaling};
}

ops::GroupedFfnParams MoeLayer::ffn_params(int64_t tokens) const {
  return {.rows = tokens * cfg_.top_k,
          .experts = cfg_.num_experts,
          .in = cfg_.latent,
          .ffn = cfg_.expert_ffn,
          .lora_rank = cfg_.expert_lora.rank,
          .lora_alpha = cfg_.expert_lora.alpha,
          .gemm = gemm_};
}

std::vector<ParamSpec> MoeLayer::param_specs() const {
  const int64_t E = cfg_.num_experts, d = cfg_.hidden, l = cfg_.latent, F = cfg_.expert_ffn;
  const int64_t r = cfg_.expert_lora.rank;
  std::vector<ParamSpec> s;
  s.push_back({.name = "gate.weight", .shape = {E, d}, .std = kInitStd});
  if (cfg_.selection_bias)
    s.push_back({.name = "gate.e_score_correction_bias",
                 .shape = {E},
                 .init = ParamInit::Zeros,
                 .role = ParamRole::Buffer});
  if (has_latent()) {
    latent_down_.add_specs(s);
    latent_up_.add_specs(s);
  }
  s.push_back({.name = "experts.gate_up_proj",
               .shape = {E, 2 * F, l},
               .std = kInitStd,
               .role = ParamRole::Expert,
               .per_expert = true});
  s.push_back({.name = "experts.down_proj",
               .shape = {E, l, F},
               .std = kInitStd,
               .role = ParamRole::Expert,
               .per_expert = true});
  if (r > 0) {
    // As PEFT does: A random, B zero, so the adapted model starts equal to the base.
    s.push_back({.name = "experts.gate_up_lora_A",
                 .shape = {E, r, l},
                 .std = kInitStd,
                 .role = ParamRole::Lora,
                 .per_expert = true});
    s.push_back({.name = "experts.gate_up_lora_B",
                 .shape = {E, 2 * F, r},
                 .init = ParamInit::Zeros,
                 .role = ParamRole::Lora,
                 .per_expert = true});
    s.push_back({.name = "experts.down_lora_A",
                 .shape = {E, r, F},
                 .std = kInitStd,
                 .role = ParamRole::Lora,
                 .per_expert = true});
    s.push_back({.name = "experts.down_lora_B",
                 .shape = {E, l, r},
                 .init = ParamInit::Zeros,
                 .role = ParamRole::Lora,
                 .per_expert = true});
  }
  if (cfg_.num_shared > 0) {
    shared_gate_.add_specs(s);
    shared_up_.add_specs(s);
    shared_down_.add_specs(s);
  }
  return s;
}

bool MoeLayer::take_experts_grad_zero() {
  const auto [gu, dn] = experts_grad_zero_;
  const bool zero =
      experts_grad_.gate_up.defined() && experts_grad_.down.defined() && gu && dn && *gu && *dn;
  for (bool* z : experts_grad_zero_)
    if (z) *z = false;
  return zero;
}

void MoeLayer::bind(const ParamTable& params) {
  const int64_t E = cfg_.num_experts, d = cfg_.hidden, l = cfg_.latent, F = cfg_.expert_ffn;
  const int64_t r = cfg_.expert_lora.rank, El = expert_count_;
  gate_ = need_param(params, "gate.weight", {E, d});
  bias_ =
      cfg_.selection_bias ? need_param(params, "gate.e_score_correction_bias", {E}) : ParamRef{};
  if (has_latent()) {
    latent_down_.bind(params);
    latent_up_.bind(params);
  }
  ParamRef gu = need_param(params, "experts.gate_up_proj", {El, 2 * F, l});
  ParamRef dn = need_param(params, "experts.down_proj", {El, l, F});
  experts_ = {.gate_up = gu.value, .down = dn.value};
  experts_grad_ = {.gate_up = gu.grad, .down = dn.grad};
  experts_grad_zero_ = {gu.grad_zero, dn.grad_zero};
  if (r > 0) {
    ParamRef gua = need_param(params, "experts.gate_up_lora_A", {El, r, l});
    ParamRef gub = need_param(params, "experts.gate_up_lora_B", {El, 2 * F, r});
    ParamRef dna = need_param(params, "experts.down_lora_A", {El, r, F});
    ParamRef dnb = need_param(params, "experts.down_lora_B", {El, l, r});
    experts_.gate_up_a = gua.value;
    experts_.gate_up_b = gub.value;
    experts_.down_a = dna.value;
    experts_.down_b = dnb.value;
    experts_grad_.gate_up_a = gua.grad;
    experts_grad_.gate_up_b = gub.grad;
    experts_grad_.down_a = dna.grad;
    experts_grad_.down_b = dnb.grad;
  }
  if (cfg_.num_shared > 0) {
    shared_gate_.bind(params);
    shared_up_.bind(params);
    shared_down_.bind(params);
  }
}

void MoeLayer::plan_activations(const SeqInfo& seq, ArenaPlan& plan) const {
  const int64_t T = seq.tokens, E = cfg_.num_experts, K = cfg_.top_k, l = cfg_.latent;
  const int64_t N = T * K;
  plan.add_fp32({T, E});  // logits
  plan.add_fp32({T, E});  // scores
  plan.add({T, K}, DType::I32);
  plan.add_fp32({T, K});      // routing weights
  plan.add({N}, DType::I32);  // perm
  plan.add({N}, DType::I32);  // inv
  plan.add({E + 1}, DType::I32);
  if (has_latent()) {
    plan.add({T, l});
    latent_down_.plan(T, plan);
  }
  // Gathered rows, with the K-concatenation path's spare columns where it runs.
  const ops::GroupedFfnParams fp = ffn_params(T, plan.device(), plan.activations());
  plan.add({N, ops::grouped_ffn_rows_pitch(fp)});
  ops::grouped_ffn_plan(fp, plan);
  plan.add({N, l});  // expert outputs
  if (has_latent()) {
    plan.add({T, l});
    latent_up_.plan(T, plan);
  }
  if (cfg_.num_shared > 0) {
    const int64_t S = shared_width();
    for (int i = 0; i < 3; ++i) plan.add({T, S});
    shared_gate_.plan(T, plan);
    shared_up_.plan(T, plan);
    shared_down_.plan(T, plan);
  }
}

void MoeLayer::forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
                       LayerState& st) {
  Saved& s = state_as<Saved>(st, "moe layer");
  const int64_t T = seq.tokens, E = cfg_.num_experts, K = cfg_.top_k, d = cfg_.hidden;
  const int64_t l = cfg_.latent, N = T * K;
  expect_shape(x, {T, d}, "moe input");
  expect_shape(y, {T, d}, "moe output");
  MT_CHECK(gate_.value.defined(), InternalError, "moe layer used before bind");
  const ops::RouterParams rp = router_params(T);
  s.x = x;
  const DType at = x.dtype();

  // The router runs in fp32 from here: its GEMM reads x and the gate in their storage dtype and
  // writes fp32 logits.
  s.logits = acts.alloc({T, E}, DType::F32);
  ops::matmul(ctx, x, false, gate_.value, true, s.logits);
  s.scores = acts.alloc({T, E}, DType::F32);
  s.ids = acts.alloc({T, K}, DType::I32);
  s.weights = acts.alloc({T, K}, DType::F32);
  s.overflow = overflow_on_;
  if (s.overflow) {
    ArenaScope scope(ctx.workspace());
    ops::RouterParams wide = rp;
    wide.top_k = K + overflow_.extra;
    Tensor cand = ctx.workspace().alloc({T, wide.top_k}, DType::I32);
    Tensor cand_w = ctx.workspace().alloc({T, wide.top_k}, DType::F32);
    ops::router_forward(ctx, wide, s.logits, bias_.value, s.scores, cand, cand_w);
    ops::OverflowParams op = overflow_;
    op.tokens = T;
    op.experts = E;
    op.top_k = K;
    overflow_stats_ = ops::overflow_route_forward(ctx, op, rp, overflow_rank_, s.scores,
                                                  bias_.value, cand, s.ids, s.weights);
  } else {
    ops::router_forward(ctx, rp, s.logits, bias_.value, s.scores, s.ids, s.weights);
  }
  if (trace_width_ > 0) {
    // A separate top-W pass: the routing above may use another width (or none), and a trace must
    // show the candidates as the router ranks them, not as the overflow policy left them.
    ArenaScope scope(ctx.workspace());
    ops::RouterParams wide = rp;
    wide.top_k = trace_width_;
    Tensor cand = ctx.workspace().alloc({T, trace_width_}, DType::I32);
    Tensor cand_w = ctx.workspace().alloc({T, trace_width_}, DType::F32);
    Tensor sc = ctx.workspace().alloc({T, E}, DType::F32);
    ops::router_forward(ctx, wide, s.logits, bias_.value, sc, cand, cand_w);
    const auto n = static_cast<size_t>(T * trace_width_);
    // Traces are diagnostics: on a GPU they read the candidates back (a synchronisation).
    const Tensor cand_h = cand.to(Device::CPU), sc_h = sc.to(Device::CPU);
    const Tensor bias_h = bias_.value.defined() ? bias_.value.to(Device::CPU) : Tensor();
    trace_cand_.assign(cand_h.i32(), cand_h.i32() + n);
    trace_prio_.resize(n);
    const float* b = bias_h.defined() ? bias_h.f32() : nullptr;
    for (size_t i = 0; i < n; ++i) {
      const auto t = static_cast<int64_t>(i) / trace_width_;
      const int32_t e = trace_cand_[i];
      trace_prio_[i] = sc_h.f32()[t * E + e] + (b ? b[e] : 0.f);
    }
  }
  last_ids_ = s.ids;
  ensure_scalar(aux_[0].value, ctx.device());
  ensure_scalar(aux_[1].value, ctx.device());
  ops::router_seq_aux_loss(ctx, rp, seq, s.scores, s.ids, aux_[0].value);
  ops::router_z_loss(ctx, rp, s.logits, aux_[1].value);

  s.perm = acts.alloc({N}, DType::I32);
  s.inv = acts.alloc({N}, DType::I32);
  s.offsets = acts.alloc({E + 1}, DType::I32);
  const bool on_host = ctx.device() == Device::CPU;
  if (!on_host && (!load_dev_.defined() || load_dev_.device() != ctx.device())) {
    load_dev_ = Tensor::empty({E}, DType::I64, ctx.device());
    load_dev_.copy_from(Tensor(load_.data(), {E}, DType::I64));
  }
  Tensor load = on_host ? Tensor(load_.data(), {E}, DType::I64) : load_dev_;
  load_stale_ = !on_host;
  if (slot_of_.empty()) {
    ops::moe_dispatch_plan(ctx, s.ids, E, s.perm, s.inv, s.offsets);
    ops::expert_load_count(ctx, s.offsets, Tensor(), load);
  } else {
    // The plan sorts by the ids it is given: sort by slot, then restore the logical ids that
    // backward (router, aux loss) reads. The sort is stable, so each expert's rows keep their
    // order and its GEMM sees the same rows wherever it lives.
    if (!slot_of_t_.defined() || slot_of_t_.device() != ctx.device()) {
      slot_of_t_ = Tensor(slot_of_.data(), {E}, DType::I32).to(ctx.device());
      expert_at_t_ = Tensor(expert_at_.data(), {E}, DType::I32).to(ctx.device());
    }
    ops::map_ids(ctx, s.ids, slot_of_t_);
    ops::moe_dispatch_plan(ctx, s.ids, E, s.perm, s.inv, s.offsets);
    ops::map_ids(ctx, s.ids, expert_at_t_);
    ops::expert_load_count(ctx, s.offsets, expert_at_t_, load);
  }
  // The grouped GEMMs launch per group from host offsets: on a GPU, the layer's one read of the
  // device (docs/gpu.md, synchronisation points); backward reuses it.
  if (on_host) {
    s.group_offsets = s.offsets;
  } else {
    if (!s.offsets_host.defined() || s.offsets_host.numel() != E + 1)
      s.offsets_host = Tensor::empty({E + 1}, DType::I32);
    s.offsets_host.copy_from(s.offsets);
    s.group_offsets = s.offsets_host;
  }

  if (has_latent()) {
    s.x_lat = acts.alloc({T, l}, at);
    latent_down_.forward(ctx, x, s.x_lat, acts, s.latent_down);
  } else {
    s.x_lat = x;
  }
  // K-concatenation: the experts write X A^T into the rows' last r columns (ops/grouped_ffn.h).
  const ops::GroupedFfnParams fp = ffn_params(T, ctx.device(), at);
  s.rows = acts.alloc({N, ops::grouped_ffn_rows_pitch(fp)}, at).cols(0, l);
  ops::moe_gather(ctx, s.x_lat, s.perm, K, s.rows);
  s.ffn = ops::grouped_ffn_alloc_saved(fp, acts, at);
  s.rows_out = acts.alloc({N, l}, at);
  if (remote_) {
    if (s.expert_by != remote_) {
      s.expert = remote_->make_state();
      s.expert_by = remote_;
    }
    remote_->forward(ctx, fp, s.rows, s.group_offsets, experts_, s.rows_out, *s.expert);
  } else {
    ops::grouped_ffn_forward(ctx, fp, s.rows, s.group_offsets, experts_, s.rows_out, s.ffn);
  }
  if (has_latent()) {
    s.y_lat = acts.alloc({T, l}, at);
    ops::moe_combine(ctx, s.rows_out, s.weights, s.inv, s.y_lat);
    latent_up_.forward(ctx, s.y_lat, y, acts, s.latent_up);
  } else {
    ops::moe_combine(ctx, s.rows_out, s.weights, s.inv, y);
  }

  if (cfg_.num_shared > 0) {
    const int64_t S = shared_width();
    s.sh_gate = acts.alloc({T, S}, at);
    s.sh_up = acts.alloc({T, S}, at);
    s.sh_h = acts.alloc({T, S}, at);
    shared_gate_.forward(ctx, x, s.sh_gate, acts, s.shared_gate);
    shared_up_.forward(ctx, x, s.sh_up, acts, s.shared_up);
    ops::swiglu_forward(ctx, s.sh_gate, s.sh_up, s.sh_h);
    ArenaScope scope(ctx.workspace());
    Tensor ys = ctx.workspace().alloc({T, d}, at);
    shared_down_.forward(ctx, s.sh_h, ys, acts, s.shared_down);
    ops::add_into(ctx, ys, y);
  }
}

void MoeLayer::backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                        LayerState& st) {
  Saved& s = state_as<Saved>(st, "moe layer");
  const int64_t T = seq.tokens, E = cfg_.num_experts, K = cfg_.top_k, d = cfg_.hidden;
  const int64_t l = cfg_.latent, N = T * K;
  MT_CHECK(s.x.defined() && s.x.dim(0) == T, InternalError,
           "moe backward without a matching forward");
  expect_shape(dy, {T, d}, "moe dy");
  expect_shape(dx, {T, d}, "moe dx");
  ArenaScope scope(ctx.workspace());
  Arena& ws = ctx.workspace();
  const DType at = s.x.dtype();
  bool dx_written = false;

  if (cfg_.num_shared > 0) {
    const int64_t S = shared_width();
    Tensor dh = ws.alloc({T, S}, at), dg = ws.alloc({T, S}, at), du = ws.alloc({T, S}, at);
    shared_down_.backward(ctx, s.shared_down, dy, dh);
    ops::swiglu_backward(ctx, s.sh_gate, s.sh_up, dh, dg, du);
    shared_gate_.backward(ctx, s.shared_gate, dg, dx);
    shared_up_.backward(ctx, s.shared_up, du, dx, /*accumulate_dx=*/true);
    dx_written = true;
  }

  Tensor dy_lat = dy;
  if (has_latent()) {
    dy_lat = ws.alloc({T, l}, at);
    latent_up_.backward(ctx, s.latent_up, dy, dy_lat);
  }
  // As forward's rows: dY with the r columns the experts fill with s dY B (ops/grouped_ffn.h).
  ops::GroupedFfnParams fp = ffn_params(T, ctx.device(), at);
  // The experts' weight gradients are this backward's alone: the first since zero_grad writes
  // them (its dW GEMMs skip reading the f32 buffers), later ones (accumulation) add.
  fp.weight_grads_zero = take_experts_grad_zero();
  Tensor drows_out = ws.alloc({N, ops::grouped_ffn_rows_pitch(fp)}, at).cols(0, l);
  Tensor dweights = ws.alloc({T, K}, DType::F32);
  ops::moe_combine_backward(ctx, s.rows_out, s.weights, s.inv, dy_lat, drows_out, dweights);
  Tensor drows = ws.alloc({N, l}, at);
  if (remote_) {
    MT_CHECK(s.expert && s.expert_by == remote_, InternalError,
             "moe backward: the forward ran without this expert compute");
    remote_->backward(ctx, fp, experts_, drows_out, drows, experts_grad_, *s.expert);
  } else {
    ops::grouped_ffn_backward(ctx, fp, s.rows, s.group_offsets, experts_, s.ffn, drows_out, drows,
                              experts_grad_);
  }
  if (has_latent()) {
    Tensor dx_lat = ws.alloc({T, l}, at);
    ops::moe_gather_backward(ctx, drows, s.inv, K, dx_lat);
    latent_down_.backward(ctx, s.latent_down, dx_lat, dx, dx_written);
  } else {
    ops::moe_gather_backward(ctx, drows, s.inv, K, dx, dx_written);
  }

  // Router: gate weights, then the balance losses with their coefficients.
  const ops::RouterParams rp = router_params(T);
  Tensor dlogits = ws.alloc({T, E}, DType::F32);
  if (s.overflow)
    ops::overflow_route_backward(ctx, rp, s.scores, s.ids, dweights, dlogits);
  else
    ops::router_backward(ctx, rp, s.scores, s.ids, dweights, dlogits);
  if (cfg_.seq_aux_coeff != 0.f)
    ops::router_seq_aux_backward(ctx, rp, seq, s.scores, s.ids,
                                 cfg_.seq_aux_coeff * seq_aux_weight_, dlogits);
  if (cfg_.z_loss_coeff != 0.f)
    ops::router_z_loss_backward(ctx, rp, s.logits, cfg_.z_loss_coeff, dlogits);
  // The router's gradient is fp32, x and the gate are in their storage dtype, and a GEMM reads
  // both operands in one dtype: narrow dlogits (the gate's gradient still accumulates in fp32).
  Tensor dl = dlogits;
  if (at != DType::F32) {
    dl = ws.alloc({T, E}, at);
    ops::copy(ctx, dlogits, dl);
  }
  if (gate_.trainable()) ops::matmul(ctx, dl, true, s.x, false, gate_.grad, 1.f, 1.f);
  ops::matmul(ctx, dl, false, gate_.value, false, dx, 1.f, 1.f);
}

const std::vector<int64_t>& MoeLayer::expert_load() const {
  if (load_stale_) {
    Tensor(load_.data(), {cfg_.num_experts}, DType::I64).copy_from(load_dev_);
    load_stale_ = false;
  }
  return load_;
}

void MoeLayer::set_expert_load(std::vector<int64_t> load) {
  MT_CHECK(static_cast<int64_t>(load.size()) == cfg_.num_experts, ShapeError, "expert load has ",
           load.size(), " entries, expected ", cfg_.num_experts);
  load_ = std::move(load);
  if (load_dev_.defined())
    load_dev_.copy_from(Tensor(load_.data(), {cfg_.num_experts}, DType::I64));
  load_stale_ = false;
}

void MoeLayer::reset_expert_load() {
  std::fill(load_.begin(), load_.end(), int64_t{0});
  if (load_dev_.defined()) load_dev_.zero_();
  load_stale_ = false;
}

void MoeLayer::update_selection_bias(Context& ctx) {
  // A bias on a GPU means every counted forward ran there, into load_dev_. The reset's memset
  // (legacy stream) waits for the kernel reading it: the context's stream is a blocking one.
  if (cfg_.selection_bias && bias_.value.defined() && bias_.value.device() != Device::CPU &&
      load_dev_.defined() && load_dev_.device() == bias_.value.device())
    ops::router_bias_update(ctx, load_dev_, cfg_.bias_update_rate, bias_.value);
  else
    update_selection_bias(ctx, expert_load());
  reset_expert_load();
}

void MoeLayer::update_selection_bias(Context& ctx, const std::vector<int64_t>& load) {
  if (!cfg_.selection_bias) return;
  MT_CHECK(static_cast<int64_t>(load.size()) == cfg_.num_experts, ShapeError, "expert load has ",
           load.size(), " entries, expected ", cfg_.num_experts);
  MT_CHECK(bias_.value.defined(), InternalError, "moe bias update before bind");
  if (load_t_.device() != bias_.value.device())
    load_t_ = Tensor::zeros({cfg_.num_experts}, DType::I64, bias_.value.device());
  // A copy on the legacy stream: ordered after the last update's kernel, which read load_t_
  // (the context's stream is a blocking one, core/cuda/resources.h).
  load_t_.copy_from(Tensor(const_cast<int64_t*>(load.data()), {cfg_.num_experts}, DType::I64));
  ops::router_bias_update(ctx, load_t_, cfg_.bias_update_rate, bias_.value);
}

}  // namespace mt
