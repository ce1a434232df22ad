#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "harness/seed.h"
#include "layers/test_mla_layer_case.h"
#include "model/dsa_layer.h"
#include "model/mla_layer.h"
#include "ops/attention.h"
#include "ref/dsa_ref.h"

namespace mt::test {
namespace {

const std::vector<int64_t> kLengths{30, 37};  // T = 67 over two documents

// A layer input and output gradient [T, 24] over kLengths, drawn from rng (x first).
struct LayerIo {
  SeqInfo seq;
  Tensor x, dy;
};
LayerIo layer_io(Rng& rng) {
  LayerIo io{.seq = SeqInfo::from_lengths(kLengths)};
  io.x = Tensor::empty({io.seq.tokens, 24});
  io.dy = Tensor::empty({io.seq.tokens, 24});
  fill_normal(rng, io.x);
  fill_normal(rng, io.dy);
  return io;
}

DsaConfig base_config(int64_t topk) {
  DsaConfig c;
  c.mla = {.hidden = 24,
           .heads = 3,
           .q_lora_rank = 16,
           .kv_lora_rank = 12,
           .qk_nope_dim = 8,
           .qk_rope_dim = 4,
           .v_head_dim = 6,
           .rope_style = ops::RopeStyle::Interleaved,
           .output_gate = true};
  c.index_heads = 4;
  c.index_head_dim = 8;
  c.index_rope_dim = 4;
  c.index_topk = topk;
  c.indexer_norm_eps = 1e-6f;
  return c;
}

bool is_indexer(const std::string& n) {
  return n.rfind("indexer.", 0) == 0;
}

// Top-k selection is piecewise constant in the inputs: a random draw whose k-th and (k+1)-th
// scores are within float rounding of each other (or a finite-difference step that crosses such
// a tie) would flip a selection between the fp32 layer and the double reference. Every case
// draws fresh inputs; sparse ones redraw until the selection is clear of ties (away_from_ties).
//
// The KL reads the scores themselves, and each is a sum of ReLU(q . k): where one q . k of the
// table sits at the kink, the central difference straddles it and measures the mean of the two
// slopes (DsaLayer.SparseTopkIndexerKl failed so with MOETRAIN_TEST_SEED=9467473187166456164: a
// q . k of 8.9e-9 |q||k|, gradients of k_norm, wk and wq_b off by 1%). The finite-difference
// step moves an indexer parameter by 1e-6 of its rms, so q and k by about 1e-6 (relative) and
// fp32 rounds q . k to ~5e-7 |q||k| (D = 8); draws within 1e-4 |q||k| of a kink, 100 times
// that, are redrawn. check_op caps the redraws at 2000 and prints both margins with a failure.
constexpr double kMinMargin = 1e-4;

std::function<bool(const std::map<std::string, DVec>&, const DVec&, std::string&)> away_from_ties(
    DsaConfig cfg) {
  return [cfg](const std::map<std::string, DVec>& p, const DVec& x, std::string& note) {
    const ref::DsaRefOut o = ref::dsa_layer(cfg, p, x, offsets_of(kLengths));
    // Dense warm-up selects every causal position: no top-k to tie.
    const double sel = cfg.dense_warmup ? 1e300 : ref::selection_margin(o, cfg.index_topk);
    // The LM path (coefficient 0) reads the scores only through the selection.
    const bool kl = cfg.indexer_loss_coeff != 0.f;
    note = cat("top-k margin ", sel, " (relative to the row's largest score), ReLU margin ",
               o.relu_margin, kl ? " (|q.k| / |q||k|)" : " (not read: no KL)");
    return sel > kMinMargin && (!kl || o.relu_margin > kMinMargin);
  };
}

// LM path: y only, indexer coefficient 0. Every parameter is checked; the indexer's must get
// exactly nothing (its finite differences are 0 while the selection stays put).
LayerCaseSpec lm_case(const std::string& name, DsaConfig cfg) {
  cfg.indexer_loss_coeff = 0.f;
  LayerCaseSpec s;
  s.name = name;
  s.make = [cfg] { return std::make_unique<DsaLayer>(cfg); };
  s.lengths = kLengths;
  s.hidden = cfg.mla.hidden;
  s.reference = [cfg](const std::map<std::string, DVec>& p, const DVec& x) {
    return std::vector<DVec>{ref::dsa_layer(cfg, p, x, offsets_of(kLengths)).y};
  };
  s.accept = away_from_ties(cfg);
  return s;
}

// Indexer path: the KL value is the only output. Only indexer parameters are differentiable;
// the rest (and x) must receive nothing from it.
LayerCaseSpec kl_case(const std::string& name, DsaConfig cfg) {
  cfg.indexer_loss_coeff = 0.5f;
  LayerCaseSpec s;
  s.name = name;
  s.make = [cfg] { return std::make_unique<DsaLayer>(cfg); };
  s.lengths = kLengths;
  s.hidden = cfg.mla.hidden;
  s.output_y = false;
  s.output_kl = true;
  s.kl_coeff = cfg.indexer_loss_coeff;
  s.accept = away_from_ties(cfg);
  s.x_differentiable = false;
  s.expect_zero_dx = true;
  s.differentiable = is_indexer;
  s.untouched = [](const std::string& n) { return !is_indexer(n); };
  s.reference = [cfg, k = s.kl_output_scale](const std::map<std::string, DVec>& p, const DVec& x) {
    return std::vector<DVec>{{ref::dsa_layer(cfg, p, x, offsets_of(kLengths)).kl * k}};
  };
  return s;
}

CheckOptions tol(uint64_t seed = 0) {
  return {.fwd_rtol = 2e-5, .grad_rtol = 2e-4, .seed = seed};
}

TEST(DsaLayer, SparseTopkLmPath) {
  LayerCase c(lm_case("dsa_top16_lm", base_config(16)));
  check_op(c, tol());
}

TEST(DsaLayer, SparseTopkIndexerKl) {
  LayerCase c(kl_case("dsa_top16_kl", base_config(16)));
  check_op(c, tol());
}

TEST(DsaLayer, TopkAboveTLmPath) {
  LayerCase c(lm_case("dsa_top80_lm", base_config(80)));
  check_op(c, tol());
}

TEST(DsaLayer, TopkAboveTIndexerKl) {
  LayerCase c(kl_case("dsa_top80_kl", base_config(80)));
  check_op(c, tol());
}

TEST(DsaLayer, LoraSparse) {
  DsaConfig cfg = base_config(16);
  cfg.mla.lora = {.rank = 2, .alpha = 4.f};
  auto frozen = [](const std::string& n) {
    return ends_with(n, "proj.weight") || ends_with(n, "mqa.weight") ||
           ends_with(n, "wq_b.weight") || ends_with(n, "wk.weight");
  };
  LayerCaseSpec lm = lm_case("dsa_lora_lm", cfg);
  lm.frozen = frozen;
  LayerCase c1(lm);
  check_op(c1, tol());
  LayerCaseSpec kl = kl_case("dsa_lora_kl", cfg);
  kl.frozen = frozen;
  LayerCase c2(kl);
  check_op(c2, tol());
}

// Warm-up, LM path: dense attention, dx exact, every MLA gradient left untouched.
TEST(DsaLayer, DenseWarmupLmPathFreezesMla) {
  DsaConfig cfg = base_config(16);
  cfg.dense_warmup = true;
  LayerCaseSpec s = lm_case("dsa_warmup_lm", cfg);
  s.differentiable = [](const std::string&) { return false; };
  s.untouched = [](const std::string& n) { return !is_indexer(n); };
  // The output is the dense MLA's, whatever index_topk says.
  MlaConfig mla = cfg.mla;
  s.reference = [mla](const std::map<std::string, DVec>& p, const DVec& x) {
    return std::vector<DVec>{ref::mla_layer(mla, p, x, offsets_of(kLengths))};
  };
  LayerCase c(s);
  check_op(c, tol());
}

// Warm-up, indexer path: KL against the dense attention over all causal positions.
TEST(DsaLayer, DenseWarmupIndexerKl) {
  DsaConfig cfg = base_config(16);
  cfg.dense_warmup = true;
  LayerCase c(kl_case("dsa_warmup_kl", cfg));
  check_op(c, tol());
}

struct LayerRun {
  std::vector<ParamSpec> specs;
  std::vector<Tensor> values, grads;
  Tensor y, dx;
  double kl = 0;
  // The layer's activations (its selection among them) live here: kept for reads after the run.
  std::unique_ptr<Arena> acts;
};

// Runs one forward + backward with parameters drawn from `seed` (same names -> same values);
// parameters `frozen` names are bound without a gradient. `backward_follows`: the forward is told
// so (a training step's, Model::Pass::Train); the KL is read after backward either way.
LayerRun run_layer(Layer& layer, uint64_t seed, const SeqInfo& seq, const Tensor& x,
                   const Tensor& dy,
                   const std::function<bool(const std::string&)>& frozen = nullptr,
                   bool backward_follows = false) {
  LayerRun r;
  r.specs = layer.param_specs();
  ParamTable table;
  for (const ParamSpec& p : r.specs) {
    Rng rng = Rng(seed).fork(std::hash<std::string>{}(p.name));
    Tensor v = Tensor::empty(p.shape);
    fill_normal(rng, v, ends_with(p.name, "norm.weight") ? 0.0 : 0.3);
    if (ends_with(p.name, "norm.weight"))
      for (int64_t e = 0; e < v.numel(); ++e) v.f32()[e] += 1.f;
    Tensor g = frozen && frozen(p.name) ? Tensor() : Tensor::zeros(p.shape);
    r.values.push_back(v);
    r.grads.push_back(g);
    table[p.name] = {.value = v, .grad = g};
  }
  layer.bind(table);
  Context ctx;
  ArenaPlan plan;
  layer.plan_activations(seq, plan);
  r.acts = std::make_unique<Arena>(plan.bytes(), Device::CPU, "acts");
  r.y = Tensor::empty(x.shape());
  r.dx = Tensor::empty(x.shape());
  DsaLayer::Saved st;
  st.backward_follows = backward_follows;
  layer.forward(ctx, seq, x, r.y, *r.acts, st);
  EXPECT_EQ(r.acts->used(), plan.bytes()) << "activations differ from plan_activations";
  layer.backward(ctx, seq, dy, r.dx, st);
  for (const AuxLoss& a : layer.aux_losses())
    if (a.name == "indexer_kl") r.kl = a.value;
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// With index_topk >= T every causal position is selected, in the dense table's order, so the
// sparse layer is bit-identical to dense MLA: output, dx and every MLA gradient (the layer then
// attends densely: selects_every_key, which the table check below justifies). Its KL equals the
// warm-up's (same set, same target).
TEST(DsaLayer, TopkAtLeastTEqualsDenseMlaExactly) {
  SeqInfo seq = SeqInfo::from_lengths(kLengths);
  Rng rng(test_seed());
  const uint64_t params = test_seed();  // the same parameters for the three layers
  Tensor x = Tensor::empty({seq.tokens, 24}), dy = Tensor::empty({seq.tokens, 24});
  fill_normal(rng, x);
  fill_normal(rng, dy);
  for (int64_t topk : {67, 80}) {
    DsaConfig cfg = base_config(topk);
    DsaLayer dsa(cfg);
    MlaLayer mla(cfg.mla);
    LayerRun a = run_layer(dsa, params, seq, x, dy);
    LayerRun b = run_layer(mla, params, seq, x, dy);
    Tensor dense_table = Tensor::empty(dsa.selected().shape(), DType::I32);
    ops::causal_indices(seq, dense_table);
    EXPECT_TRUE(same_bits(dsa.selected(), dense_table)) << "selection, topk " << topk;
    EXPECT_TRUE(same_bits(a.y, b.y)) << "y, topk " << topk;
    EXPECT_TRUE(same_bits(a.dx, b.dx)) << "dx, topk " << topk;
    for (size_t i = 0; i < b.specs.size(); ++i) {
      ASSERT_EQ(a.specs[i].name, b.specs[i].name);
      EXPECT_TRUE(same_bits(a.grads[i], b.grads[i])) << b.specs[i].name << ", topk " << topk;
    }
    DsaConfig wcfg = cfg;
    wcfg.dense_warmup = true;
    DsaLayer warm(wcfg);
    LayerRun w = run_layer(warm, params, seq, x, dy);
    EXPECT_TRUE(same_bits(a.y, w.y)) << "warm-up y, topk " << topk;
    EXPECT_EQ(a.kl, w.kl) << "topk " << topk;
    EXPECT_GT(a.kl, 0.0);
    for (size_t i = 0; i < w.specs.size(); ++i)
      if (is_indexer(w.specs[i].name)) {
        EXPECT_TRUE(same_bits(a.grads[i], w.grads[i])) << w.specs[i].name << ", topk " << topk;
      }
  }
}

// The absorbed MQA form (W_UK folded into q, W_UV applied after, one shared latent entry per
// key) is the per-head form rearranged: the same selection, output, dx and every parameter
// gradient (kv_b_proj's W_UK and W_UV rows included) up to fp32 rounding. SparseTopkLmPath and
// SparseTopkIndexerKl check the absorbed layer (the default) against the double reference and
// finite differences; this pins it to the per-head path directly.
void expect_absorbed_equals_per_head(
    const DsaConfig& cfg, const std::function<bool(const std::string&)>& frozen = nullptr) {
  Rng rng(test_seed());
  const uint64_t params = test_seed();
  auto [seq, x, dy] = layer_io(rng);
  DsaLayer absorbed(cfg), per_head(cfg);
  per_head.set_absorbed(false);
  // The absorbed layer plans its latent-space tensors (kvl, ol; qa is rebuilt in backward) in
  // place of per-head k, v and kv_b_proj's LoRA projection: it takes that path, and saves
  // nothing else.
  ArenaPlan plan_a, plan_p, only_a, only_p;
  absorbed.plan_activations(seq, plan_a);
  per_head.plan_activations(seq, plan_p);
  const MlaConfig& m = cfg.mla;
  const int64_t T = seq.tokens, H = m.heads, Da = m.kv_lora_rank + m.qk_rope_dim;
  only_a.add({T, Da});
  only_a.add({T, H, m.kv_lora_rank});
  only_p.add({T, H, m.qk_nope_dim + m.qk_rope_dim});
  only_p.add({T, H, m.v_head_dim});
  if (m.lora.rank > 0) only_p.add({T, m.lora.rank});
  EXPECT_EQ(plan_a.bytes() - only_a.bytes(), plan_p.bytes() - only_p.bytes());
  LayerRun a = run_layer(absorbed, params, seq, x, dy, frozen);
  LayerRun b = run_layer(per_head, params, seq, x, dy, frozen);
  EXPECT_TRUE(same_bits(absorbed.selected(), per_head.selected()));
  auto close = [](const Tensor& u, const Tensor& v, const std::string& what) {
    EXPECT_LT(rel_err(to_dvec(u), to_dvec(v)), 2e-6) << what;
  };
  close(a.y, b.y, "y");
  close(a.dx, b.dx, "dx");
  EXPECT_NEAR(a.kl, b.kl, 1e-6 * std::abs(b.kl));
  for (size_t i = 0; i < b.specs.size(); ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << b.specs[i].name;
    if (b.grads[i].defined()) close(a.grads[i], b.grads[i], b.specs[i].name);
  }
}

TEST(DsaLayer, AbsorbedEqualsPerHead) {
  DsaConfig cfg = base_config(16);
  cfg.indexer_loss_coeff = 0.5f;
  expect_absorbed_equals_per_head(cfg);
}

// With a LoRA adapter on kv_b_proj the absorbed form reads W_eff = W + s B A and turns dW_eff
// into the adapter's gradients: every adapter gradient (and the base's, when it trains) matches
// the per-head path, which runs the adapter through ops::linear. run_layer draws B nonzero, so
// the adapter moves the output.
TEST(DsaLayer, AbsorbedEqualsPerHeadLora) {
  DsaConfig cfg = base_config(16);
  cfg.indexer_loss_coeff = 0.5f;
  cfg.mla.lora = {.rank = 2, .alpha = 4.f};
  expect_absorbed_equals_per_head(cfg);
  // A LoRA fine-tune: the base weights frozen, only the adapters (and norms) train.
  expect_absorbed_equals_per_head(cfg, [](const std::string& n) {
    return ends_with(n, "proj.weight") || ends_with(n, "mqa.weight") ||
           ends_with(n, "wq_b.weight") || ends_with(n, "wk.weight");
  });
}

// A forward told that backward follows leaves the KL to backward (its target from the attention
// backward: sparse_mqa_backward's prob_sum on the absorbed path, the prob-sum pass there on the
// per-head one). After backward the output, dx and every gradient equal the forward-KL run's bit
// for bit on the CPU (same ops, same inputs: qa is rebuilt by the same products), the loss to
// its summation's rounding, and the loss equals the double reference's. Sparse and above-T
// selections, both forms, a zero coefficient (the loss is still logged), the dense warm-up.
void expect_kl_in_backward_equals_forward(const DsaConfig& cfg, bool absorbed) {
  SCOPED_TRACE(cat("topk ", cfg.index_topk, absorbed ? ", absorbed" : ", per head", ", coeff ",
                   cfg.indexer_loss_coeff, cfg.dense_warmup ? ", dense warm-up" : ""));
  Rng rng(test_seed());
  const uint64_t params = test_seed();
  auto [seq, x, dy] = layer_io(rng);
  DsaLayer fwd_kl(cfg), bwd_kl(cfg);
  fwd_kl.set_absorbed(absorbed);
  bwd_kl.set_absorbed(absorbed);
  const LayerRun a = run_layer(fwd_kl, params, seq, x, dy, nullptr, false);
  const LayerRun b = run_layer(bwd_kl, params, seq, x, dy, nullptr, true);
  EXPECT_TRUE(same_bits(a.y, b.y));
  EXPECT_TRUE(same_bits(a.dx, b.dx));
  // The loss is a threaded sum whose order may differ between two runs (test_recompute.cpp).
  EXPECT_NEAR(a.kl, b.kl, 1e-12 * std::abs(a.kl));
  int64_t indexer_grads = 0;
  for (size_t i = 0; i < a.specs.size(); ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << a.specs[i].name;
    if (!a.grads[i].defined()) continue;
    EXPECT_TRUE(same_bits(a.grads[i], b.grads[i])) << a.specs[i].name;
    if (is_indexer(a.specs[i].name))
      for (int64_t e = 0; e < b.grads[i].numel(); ++e) indexer_grads += b.grads[i].f32()[e] != 0.f;
  }
  EXPECT_EQ(indexer_grads > 0, cfg.indexer_loss_coeff != 0.f);
  // The loss itself, against the double reference on the same parameters.
  std::map<std::string, DVec> P;
  for (size_t i = 0; i < b.specs.size(); ++i) P[b.specs[i].name] = to_dvec(b.values[i]);
  const ref::DsaRefOut r = ref::dsa_layer(cfg, P, to_dvec(x), offsets_of(kLengths));
  EXPECT_GT(r.kl, 0.0);
  EXPECT_NEAR(b.kl, r.kl, 1e-4 * r.kl + 1e-9);
}

TEST(DsaLayer, KlInBackwardEqualsKlInForward) {
  for (bool absorbed : {true, false})
    for (int64_t topk : {16, 80}) {
      DsaConfig cfg = base_config(topk);
      cfg.indexer_loss_coeff = 0.5f;
      expect_kl_in_backward_equals_forward(cfg, absorbed);
    }
  DsaConfig zero = base_config(16);
  zero.indexer_loss_coeff = 0.f;
  expect_kl_in_backward_equals_forward(zero, true);
  DsaConfig warmup = base_config(16);
  warmup.indexer_loss_coeff = 0.5f;
  warmup.dense_warmup = true;
  expect_kl_in_backward_equals_forward(warmup, true);
}

// A forward with backward to follow leaves the loss to backward, which overwrites whatever the
// value held.
TEST(DsaLayer, KlInBackwardIsWrittenByBackward) {
  DsaConfig cfg = base_config(16);
  cfg.indexer_loss_coeff = 0.5f;
  Rng rng(test_seed());
  auto [seq, x, dy] = layer_io(rng);
  DsaLayer dsa(cfg);
  ParamTable table;
  std::vector<Tensor> keep;
  for (const ParamSpec& p : dsa.param_specs()) {
    Tensor v = Tensor::empty(p.shape), g = Tensor::zeros(p.shape);
    fill_normal(rng, v, 0.3);
    keep.push_back(v);
    keep.push_back(g);
    table[p.name] = {.value = v, .grad = g};
  }
  dsa.bind(table);
  Context ctx;
  ArenaPlan plan;
  dsa.plan_activations(seq, plan);
  Arena acts(plan.bytes(), Device::CPU, "acts");
  Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
  DsaLayer::Saved st;
  st.backward_follows = true;
  dsa.forward(ctx, seq, x, y, acts, st);
  ASSERT_EQ(dsa.aux_losses().size(), 1u);
  const Tensor& kl = dsa.aux_terms()[0].value;
  ASSERT_TRUE(kl.defined());
  kl.f64()[0] = -1.0;  // a marker backward must overwrite
  dsa.backward(ctx, seq, dy, dx, st);
  EXPECT_GT(dsa.aux_losses()[0].value, 0.0);
}

TEST(DsaLayer, SelectionIsTopkOfCausalPositions) {
  DsaConfig cfg = base_config(16);
  SeqInfo seq = SeqInfo::from_lengths(kLengths);
  Rng rng(test_seed());
  Tensor x = Tensor::empty({seq.tokens, 24}), dy = Tensor::zeros({seq.tokens, 24});
  fill_normal(rng, x);
  DsaLayer dsa(cfg);
  const LayerRun run =
      run_layer(dsa, test_seed(), seq, x, dy);  // holds the arena `selected` points into
  const Tensor& sel = dsa.selected();
  ASSERT_EQ(sel.shape(), (Shape{67, 16}));
  for (int64_t t = 0; t < 67; ++t) {
    const int64_t start = t < 30 ? 0 : 30;
    const int64_t avail = t - start + 1;
    int64_t valid = 0, prev = -1;
    for (int64_t j = 0; j < 16; ++j) {
      const int32_t s = sel.i32()[t * 16 + j];
      if (s < 0) continue;
      ++valid;
      EXPECT_GE(s, start);
      EXPECT_LE(s, t);
      EXPECT_GT(s, prev);
      prev = s;
    }
    EXPECT_EQ(valid, std::min<int64_t>(16, avail)) << "row " << t;
  }
}

TEST(DsaLayer, AuxLossAndNames) {
  DsaConfig cfg = base_config(16);
  cfg.indexer_loss_coeff = 0.25f;
  DsaLayer dsa(cfg);
  std::vector<std::string> idx_names;
  for (const ParamSpec& p : dsa.param_specs())
    if (is_indexer(p.name)) idx_names.push_back(p.name);
  EXPECT_EQ(idx_names, (std::vector<std::string>{"indexer.wq_b.weight", "indexer.wk.weight",
                                                 "indexer.k_norm.weight", "indexer.k_norm.bias",
                                                 "indexer.weights_proj.weight"}));
  ASSERT_EQ(dsa.aux_losses().size(), 1u);
  EXPECT_EQ(dsa.aux_losses()[0].name, "indexer_kl");
  EXPECT_EQ(dsa.aux_losses()[0].weight, 0.25);
  DsaConfig bad = base_config(16);
  bad.mla.q_lora_rank = 0;
  EXPECT_THROW(DsaLayer{bad}, ConfigError);
}

}  // namespace
}  // namespace mt::test
