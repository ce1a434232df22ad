#include "model/kda_layer.h"

#include <cmath>

#include "ops/activation.h"
#include "ops/conv1d.h"
#include "ops/elementwise.h"
#include "ops/kda_gate.h"
#include "ops/kda_prep_path.h"
#include "ops/norm.h"

namespace mt {

namespace {

// fla applies the q/k L2 norm with this eps inside the root, independent of rms_norm_eps.
constexpr float kQkL2Eps = 1e-6f;

// Mamba-style decay initialisation: softplus(dt_bias) = dt, log-uniform in [1e-3, 0.1], so the
// initial per-token decay is mild and spread over time scales.
void init_dt_bias(Rng& rng, Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double dt = std::exp(rng.uniform(std::log(1e-3), std::log(0.1)));
    t.f32()[i] = static_cast<float>(dt + std::log(-std::expm1(-dt)));  // softplus^-1(dt)
  }
}

// exp(A_log) in [1, 16]: the per-head decay rate multiplier (Mamba-2 style).
void init_a_log(Rng& rng, Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = static_cast<float>(std::log(rng.uniform(1.0, 16.0)));
}

}  // namespace

bool KdaLayer::keeps_prepared(Device device, const ops::KdaParams& cp) {
  return cp.kernels.keep_prepared && device == Device::CUDA && ops::kda_chunk_kernel_fits(cp);
}

KdaLayer::KdaLayer(const KdaConfig& cfg) : cfg_(cfg) {
  MT_CHECK(
      cfg.hidden > 0 && cfg.heads > 0 && cfg.head_dim > 0 && cfg.conv_kernel > 0 && cfg.chunk > 0,
      ConfigError, "kda: hidden ", cfg.hidden, " heads ", cfg.heads, " head_dim ", cfg.head_dim,
      " conv_kernel ", cfg.conv_kernel, " chunk ", cfg.chunk, " must be positive");
  const int64_t d = cfg.hidden, K = cfg.head_dim, HK = hk();
  q_proj_ = LinearModule("q_proj", d, HK, cfg.lora);
  k_proj_ = LinearModule("k_proj", d, HK, cfg.lora);
  v_proj_ = LinearModule("v_proj", d, HK, cfg.lora);
  f_a_ = LinearModule("f_a_proj", d, K, cfg.lora);
  f_b_ = LinearModule("f_b_proj", K, HK, cfg.lora);
  b_proj_ = LinearModule("b_proj", d, cfg.heads, cfg.lora);
  g_a_ = LinearModule("g_a_proj", d, K, cfg.lora);
  g_b_ = LinearModule("g_b_proj", K, HK, cfg.lora);
  o_proj_ = LinearModule("o_proj", HK, d, cfg.lora);
}

std::vector<ParamSpec> KdaLayer::param_specs() const {
  const int64_t HK = hk(), kw = cfg_.conv_kernel;
  // nn.Conv1d's default init is uniform(+-1/sqrt(kernel)); this normal has the same variance.
  const float conv_std = 1.f / std::sqrt(3.f * static_cast<float>(kw));
  std::vector<ParamSpec> s;
  q_proj_.add_specs(s);
  k_proj_.add_specs(s);
  v_proj_.add_specs(s);
  for (const char* n : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"})
    s.push_back({.name = n, .shape = {HK, 1, kw}, .init = ParamInit::Normal, .std = conv_std});
  f_a_.add_specs(s);
  f_b_.add_specs(s);
  b_proj_.add_specs(s);
  // kda_gate reads both in fp32 whatever the policy: they feed the fp32 decay.
  s.push_back({.name = "A_log",
               .shape = {cfg_.heads},
               .init = ParamInit::Custom,
               .custom = init_a_log,
               .keep_fp32 = true});
  s.push_back({.name = "dt_bias",
               .shape = {HK},
               .init = ParamInit::Custom,
               .custom = init_dt_bias,
               .keep_fp32 = true});
  g_a_.add_specs(s);
  g_b_.add_specs(s);
  s.push_back({.name = "o_norm.weight", .shape = {cfg_.head_dim}, .init = ParamInit::Ones});
  o_proj_.add_specs(s);
  return s;
}

void KdaLayer::bind(const ParamTable& params) {
  const int64_t HK = hk(), kw = cfg_.conv_kernel;
  for (LinearModule* m :
       {&q_proj_, &k_proj_, &v_proj_, &f_a_, &f_b_, &b_proj_, &g_a_, &g_b_, &o_proj_})
    m->bind(params);
  q_conv_ = need_param(params, "q_conv1d.weight", {HK, 1, kw});
  k_conv_ = need_param(params, "k_conv1d.weight", {HK, 1, kw});
  v_conv_ = need_param(params, "v_conv1d.weight", {HK, 1, kw});
  a_log_ = need_param(params, "A_log", {cfg_.heads});
  dt_bias_ = need_param(params, "dt_bias", {HK});
  o_norm_ = need_param(params, "o_norm.weight", {cfg_.head_dim});
}

ops::KdaParams KdaLayer::core_params(const SeqInfo& seq) const {
  return {.tokens = seq.tokens,
          .heads = cfg_.heads,
          .head_k = cfg_.head_dim,
          .head_v = cfg_.head_dim,
          .num_seqs = seq.num_seqs,
          .chunked = cfg_.chunked,
          .chunk = cfg_.chunk,
          .kernels = cfg_.kernels};
}

void KdaLayer::plan_activations(const SeqInfo& seq, ArenaPlan& plan) const {
  const int64_t T = seq.tokens, H = cfg_.heads, K = cfg_.head_dim, HK = hk();
  for (const LinearModule* m :
       {&q_proj_, &k_proj_, &v_proj_, &f_a_, &f_b_, &b_proj_, &g_a_, &g_b_, &o_proj_})
    m->plan(T, plan);
  for (int i = 0; i < 8; ++i) plan.add({T, HK});  // qp kp vp, qs ks, q k v
  plan.add_fp32({T * H});                         // q_rstd
  plan.add_fp32({T * H});                         // k_rstd
  plan.add({T, K});                               // fa
  plan.add({T, HK});                              // graw (g itself lives in the workspace)
  plan.add_fp32({T, H});                          // beta (the kernel's dtype)
  plan.add({T, HK});                              // o
  const ops::KdaParams cp = core_params(seq);
  const int64_t rows = ops::kda_saved_rows(cp, seq.cu_seqlens_host);
  plan.add({rows, H, K, K}, ops::kda_saved_dtype(plan.device(), cp, plan.activations()));  // states
  if (keeps_prepared(plan.device(), cp))
    plan.add_fp32({ops::kda_prepared_floats(cp, rows, plan.activations())});
  plan.add({T, HK});       // on
  plan.add_fp32({T * H});  // o_rstd
  plan.add({T, K});        // ga
  plan.add({T, HK});       // gb
  plan.add({T, HK});       // og
}

void KdaLayer::conv_silu_forward(Context& ctx, const SeqInfo& seq, const ParamRef& w,
                                 const Tensor& proj, Tensor& out) {
  const int64_t HK = hk(), kw = cfg_.conv_kernel;
  const ops::CausalConvParams cp{.tokens = seq.tokens, .channels = HK, .kernel = kw, .silu = true};
  ops::causal_conv1d_forward(ctx, cp, seq.cu_seqlens, proj, w.value.view({HK, kw}), out);
}

void KdaLayer::conv_silu_backward(Context& ctx, const SeqInfo& seq, const ParamRef& w,
                                  const Tensor& proj, const Tensor& dout, Tensor& dproj) {
  const int64_t HK = hk(), kw = cfg_.conv_kernel;
  const ops::CausalConvParams cp{.tokens = seq.tokens, .channels = HK, .kernel = kw, .silu = true};
  Tensor dw = w.grad.defined() ? w.grad.view({HK, kw}) : Tensor();
  ops::causal_conv1d_backward(ctx, cp, seq.cu_seqlens, proj, w.value.view({HK, kw}), dout, dproj,
                              dw);
}

void KdaLayer::qk_l2norm(Context& ctx, const Tensor& qs, const Tensor& ks, Tensor& q, Tensor& k,
                         Arena& acts, Saved& s) const {
  const int64_t rows = qs.dim(0) * cfg_.heads, K = cfg_.head_dim;
  const ops::NormParams l2{.rows = rows, .dim = K, .eps = kQkL2Eps};
  s.q_rstd = acts.alloc({rows}, DType::F32);
  s.k_rstd = acts.alloc({rows}, DType::F32);
  Tensor qn = q.view({rows, K}), kn = k.view({rows, K});
  ops::l2norm_forward(ctx, l2, qs.view({rows, K}), qn, s.q_rstd);
  ops::l2norm_forward(ctx, l2, ks.view({rows, K}), kn, s.k_rstd);
}

void KdaLayer::decay_and_beta(Context& ctx, const Tensor& x, Tensor& g, Tensor& beta, Arena& acts,
                              Saved& s) const {
  const int64_t n = x.dim(0), H = cfg_.heads, K = cfg_.head_dim;
  const DType at = x.dtype();
  s.fa = acts.alloc({n, K}, at);
  f_a_.forward(ctx, x, s.fa, acts, s.f_a);
  s.graw = acts.alloc({n, hk()}, at);
  f_b_.forward(ctx, s.fa, s.graw, acts, s.f_b);
  ops::kda_gate_forward(ctx, {.tokens = n, .heads = H, .head_dim = K}, s.graw, a_log_.value,
                        dt_bias_.value, g);
  ArenaScope scope(ctx.workspace());
  Tensor braw = ctx.workspace().alloc({n, H}, at);
  b_proj_.forward(ctx, x, braw, acts, s.b_proj);
  // The projection is in the activations' dtype, the core reads beta in fp32: widen before the
  // sigmoid, so that beta itself is never rounded.
  Tensor braw32 = braw;
  if (at != DType::F32) {
    braw32 = ctx.workspace().alloc({n, H}, DType::F32);
    ops::copy(ctx, braw, braw32);
  }
  ops::sigmoid_forward(ctx, braw32, beta);
}

void KdaLayer::gated_output(Context& ctx, const Tensor& x, const Tensor& o, Tensor& y, Arena& acts,
                            Saved& s) const {
  const int64_t n = x.dim(0), H = cfg_.heads, K = cfg_.head_dim, HK = hk();
  const DType at = x.dtype();
  s.on = acts.alloc({n, HK}, at);
  s.o_rstd = acts.alloc({n * H}, DType::F32);
  {
    Tensor onv = s.on.view({n * H, K});
    ops::rmsnorm_forward(ctx, {.rows = n * H, .dim = K, .eps = cfg_.norm_eps}, o.view({n * H, K}),
                         o_norm_.value, onv, s.o_rstd);
  }
  s.ga = acts.alloc({n, K}, at);
  g_a_.forward(ctx, x, s.ga, acts, s.g_a);
  s.gb = acts.alloc({n, HK}, at);
  g_b_.forward(ctx, s.ga, s.gb, acts, s.g_b);
  s.og = acts.alloc({n, HK}, at);
  ops::sigmoid_gate_forward(ctx, s.on, s.gb, s.og);
  o_proj_.forward(ctx, s.og, y, acts, s.o_proj);
}

void KdaLayer::forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
                       LayerState& st) {
  Saved& s = state_as<Saved>(st, "kda layer");
  const int64_t T = seq.tokens, H = cfg_.heads, K = cfg_.head_dim, HK = hk();
  expect_shape(x, {T, cfg_.hidden}, "kda layer x");
  expect_shape(y, {T, cfg_.hidden}, "kda layer y");

  // q, k, v: projection, short conv, SiLU; q and k then L2-normalised per head.
  struct Branch {
    const LinearModule* proj;
    LinearModule::Saved* saved;
    const ParamRef* conv;
    Tensor *p, *s;
  };
  const DType at = x.dtype();
  s.qp = acts.alloc({T, HK}, at);
  s.kp = acts.alloc({T, HK}, at);
  s.vp = acts.alloc({T, HK}, at);
  s.qs = acts.alloc({T, HK}, at);
  s.ks = acts.alloc({T, HK}, at);
  Tensor vs = acts.alloc({T, HK}, at);
  for (Branch b : {Branch{&q_proj_, &s.q_proj, &q_conv_, &s.qp, &s.qs},
                   Branch{&k_proj_, &s.k_proj, &k_conv_, &s.kp, &s.ks},
                   Branch{&v_proj_, &s.v_proj, &v_conv_, &s.vp, &vs}}) {
    b.proj->forward(ctx, x, *b.p, acts, *b.saved);
    conv_silu_forward(ctx, seq, *b.conv, *b.p, *b.s);
  }
  s.v = vs.view({T, H, K});
  s.q = acts.alloc({T, H, K}, at);
  s.k = acts.alloc({T, H, K}, at);
  qk_l2norm(ctx, s.qs, s.ks, s.q, s.k, acts, s);
  s.beta = acts.alloc({T, H}, DType::F32);
  s.o = acts.alloc({T, H, K}, at);
  ops::KdaParams cp = core_params(seq);
  cp.keep_for_backward = !s.no_backward;
  const int64_t rows = ops::kda_saved_rows(cp, seq.cu_seqlens_host);
  s.states = acts.alloc({rows, H, K, K}, ops::kda_saved_dtype(ctx.device(), cp, s.q.dtype()));
  s.prepared = keeps_prepared(ctx.device(), cp)
                   ? acts.alloc({ops::kda_prepared_floats(cp, rows, s.q.dtype())}, DType::F32)
                   : Tensor();
  {
    // The log decay g lives in the workspace and backward forms it again from graw (one pass at
    // memory speed), rather than staying fp32 [T, H K] with the activations until backward.
    ArenaScope scope(ctx.workspace());
    Tensor g = ctx.workspace().alloc({T, HK}, DType::F32);
    decay_and_beta(ctx, x, g, s.beta, acts, s);
    // The delta-rule core, every document from a zero state.
    Tensor no_state;
    ops::kda_forward(ctx, cp, seq.cu_seqlens, s.q, s.k, s.v, g.view({T, H, K}), s.beta, Tensor(),
                     s.o, no_state, s.states, s.prepared);
  }

  gated_output(ctx, x, s.o, y, acts, s);
}

void KdaLayer::backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                        LayerState& st) {
  Saved& s = state_as<Saved>(st, "kda layer");
  const int64_t T = seq.tokens, H = cfg_.heads, K = cfg_.head_dim, HK = hk();
  MT_CHECK(s.og.defined() && s.og.dim(0) == T, InternalError,
           "kda layer backward without a matching forward");
  expect_shape(dy, {T, cfg_.hidden}, "kda layer dy");
  expect_shape(dx, {T, cfg_.hidden}, "kda layer dx");
  Arena& ws = ctx.workspace();
  ArenaScope scope(ws);
  const DType at = s.og.dtype();

  // Output projection and gate; the gate branch is the first to reach x, so it writes dx.
  Tensor dog = ws.alloc({T, HK}, at), don = ws.alloc({T, HK}, at), dgb = ws.alloc({T, HK}, at);
  o_proj_.backward(ctx, s.o_proj, dy, dog);
  ops::sigmoid_gate_backward(ctx, s.on, s.gb, dog, don, dgb);
  Tensor dga = ws.alloc({T, K}, at);
  g_b_.backward(ctx, s.g_b, dgb, dga);
  g_a_.backward(ctx, s.g_a, dga, dx);

  Tensor dcore = ws.alloc({T, H, K}, at);
  {
    Tensor dcv = dcore.view({T * H, K});
    ops::rmsnorm_backward(ctx, {.rows = T * H, .dim = K, .eps = cfg_.norm_eps},
                          s.o.view({T * H, K}), o_norm_.value, s.o_rstd, don.view({T * H, K}), dcv,
                          o_norm_.grad);
  }

  Tensor dq = ws.alloc({T, H, K}, at), dk = ws.alloc({T, H, K}, at), dv = ws.alloc({T, H, K}, at),
         dg = ws.alloc({T, H, K}, DType::F32), dbeta = ws.alloc({T, H}, DType::F32);
  {
    ArenaScope gscope(ws);
    Tensor g = ws.alloc({T, HK}, DType::F32), no_dh0;
    ops::kda_gate_forward(ctx, {.tokens = T, .heads = H, .head_dim = K}, s.graw, a_log_.value,
                          dt_bias_.value, g);
    ops::kda_backward(ctx, core_params(seq), seq.cu_seqlens, s.q, s.k, s.v, g.view({T, H, K}),
                      s.beta, s.states, s.prepared, dcore, Tensor(), dq, dk, dv, dg, dbeta, no_dh0);
  }

  // beta = sigmoid(b_proj x): the sigmoid's gradient in fp32 like beta, narrowed to the
  // projection's dtype for its backward.
  {
    Tensor dbraw32 = ws.alloc({T, H}, DType::F32);
    ops::sigmoid_backward(ctx, s.beta, dbeta, dbraw32);
    Tensor dbraw = dbraw32;
    if (at != DType::F32) {
      dbraw = ws.alloc({T, H}, at);
      ops::copy(ctx, dbraw32, dbraw);
    }
    b_proj_.backward(ctx, s.b_proj, dbraw, dx, true);
  }

  // Decay gate.
  {
    Tensor dgraw = ws.alloc({T, HK}, at), dfa = ws.alloc({T, K}, at);
    ops::kda_gate_backward(ctx, {.tokens = T, .heads = H, .head_dim = K}, s.graw, a_log_.value,
                           dt_bias_.value, dg.view({T, HK}), dgraw, a_log_.grad, dt_bias_.grad);
    f_b_.backward(ctx, s.f_b, dgraw, dfa);
    f_a_.backward(ctx, s.f_a, dfa, dx, true);
  }

  // q, k (through the L2 norm) and v.
  const ops::NormParams l2{.rows = T * H, .dim = K, .eps = kQkL2Eps};
  Tensor ds = ws.alloc({T, HK}, at), dp = ws.alloc({T, HK}, at);
  Tensor dsv = ds.view({T * H, K});
  ops::l2norm_backward(ctx, l2, s.qs.view({T * H, K}), s.q_rstd, dq.view({T * H, K}), dsv);
  conv_silu_backward(ctx, seq, q_conv_, s.qp, ds, dp);
  q_proj_.backward(ctx, s.q_proj, dp, dx, true);
  ops::l2norm_backward(ctx, l2, s.ks.view({T * H, K}), s.k_rstd, dk.view({T * H, K}), dsv);
  conv_silu_backward(ctx, seq, k_conv_, s.kp, ds, dp);
  k_proj_.backward(ctx, s.k_proj, dp, dx, true);
  conv_silu_backward(ctx, seq, v_conv_, s.vp, dv.view({T, HK}), dp);
  v_proj_.backward(ctx, s.v_proj, dp, dx, true);
}

}  // namespace mt
