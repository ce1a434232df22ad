#include "ref/moe_ref.h"

#include <cmath>
#include <stdexcept>

#include "ref/router_ref.h"

namespace mt::ref {

namespace {

double silu_d(double v) {
  return v / (1.0 + std::exp(-v));
}

// y[o] = sum_i m[o, i] v[i] for an [rows, cols] block starting at m.
DVec matvec(const double* m, int64_t rows, int64_t cols, const double* v) {
  DVec y(static_cast<size_t>(rows), 0.0);
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < cols; ++i) y[o] += m[o * cols + i] * v[i];
  return y;
}

const DVec& get(const std::map<std::string, DVec>& p, const std::string& name) {
  auto it = p.find(name);
  if (it == p.end()) throw std::runtime_error("moe_ref: missing parameter " + name);
  return it->second;
}

const DVec* find(const std::map<std::string, DVec>& p, const std::string& name) {
  auto it = p.find(name);
  return it == p.end() ? nullptr : &it->second;
}

DVec proj(const std::map<std::string, DVec>& p, const std::string& name, const DVec& x,
          int64_t tokens, int64_t in, int64_t out, const LoraSpec& lora) {
  return linear(x, tokens, in, out, get(p, name + ".weight"), find(p, name + ".lora_A.weight"),
                find(p, name + ".lora_B.weight"), lora.rank, lora.alpha);
}

}  // namespace

DVec expert_ffn(const ExpertRefDims& d, const ExpertRefWeights& w, int64_t e, const double* x) {
  const int64_t l = d.in, F = d.ffn, r = d.lora_rank;
  const double s = r ? d.lora_alpha / double(r) : 0.0;
  DVec gu = matvec(w.gate_up->data() + e * 2 * F * l, 2 * F, l, x);
  if (r) {
    DVec xa = matvec(w.gate_up_a->data() + e * r * l, r, l, x);
    DVec delta = matvec(w.gate_up_b->data() + e * 2 * F * r, 2 * F, r, xa.data());
    for (int64_t i = 0; i < 2 * F; ++i) gu[i] += s * delta[i];
  }
  DVec h(static_cast<size_t>(F));
  for (int64_t i = 0; i < F; ++i) h[i] = silu_d(gu[i]) * gu[F + i];
  DVec y = matvec(w.down->data() + e * l * F, l, F, h.data());
  if (r) {
    DVec ha = matvec(w.down_a->data() + e * r * F, r, F, h.data());
    DVec delta = matvec(w.down_b->data() + e * l * r, l, r, ha.data());
    for (int64_t i = 0; i < l; ++i) y[i] += s * delta[i];
  }
  return y;
}

DVec linear(const DVec& x, int64_t tokens, int64_t in, int64_t out, const DVec& w, const DVec* a,
            const DVec* b, int64_t r, double alpha) {
  DVec y(static_cast<size_t>(tokens * out), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    DVec row = matvec(w.data(), out, in, x.data() + t * in);
    if (r > 0 && a && b) {
      DVec xa = matvec(a->data(), r, in, x.data() + t * in);
      DVec delta = matvec(b->data(), out, r, xa.data());
      for (int64_t o = 0; o < out; ++o) row[o] += alpha / double(r) * delta[o];
    }
    for (int64_t o = 0; o < out; ++o) y[t * out + o] = row[o];
  }
  return y;
}

MoeRefOut moe_layer(const MoeConfig& cfg, const std::map<std::string, DVec>& params, const DVec& x,
                    const std::vector<int64_t>& offsets) {
  const int64_t d = cfg.hidden, l = cfg.latent, E = cfg.num_experts, K = cfg.top_k;
  const int64_t T = static_cast<int64_t>(x.size()) / d;
  MoeRefOut out;

  RouterRefParams rp{.tokens = T,
                     .experts = E,
                     .top_k = K,
                     .sigmoid = cfg.score == RouterScore::Sigmoid,
                     .n_group = cfg.n_group,
                     .topk_group = cfg.topk_group,
                     .norm_topk_prob = cfg.norm_topk_prob,
                     .routed_scaling = cfg.routed_scaling};
  DVec logits = linear(x, T, d, E, get(params, "gate.weight"), nullptr, nullptr, 0, 0);
  const DVec* bias = find(params, "gate.e_score_correction_bias");
  RouterRefOut r = router(rp, logits, bias ? *bias : DVec{});
  out.ids = r.ids;
  out.weights = r.weights;
  out.seq_aux = router_seq_aux(rp, r.scores, r.ids, offsets);
  out.z = router_z(rp, logits);

  const bool latent = l < d;
  DVec xl = latent ? proj(params, "latent_down_proj", x, T, d, l, cfg.lora) : x;
  ExpertRefDims dims{.experts = E,
                     .in = l,
                     .ffn = cfg.expert_ffn,
                     .lora_rank = cfg.expert_lora.rank,
                     .lora_alpha = cfg.expert_lora.alpha};
  ExpertRefWeights w{.gate_up = &get(params, "experts.gate_up_proj"),
                     .down = &get(params, "experts.down_proj"),
                     .gate_up_a = find(params, "experts.gate_up_lora_A"),
                     .gate_up_b = find(params, "experts.gate_up_lora_B"),
                     .down_a = find(params, "experts.down_lora_A"),
                     .down_b = find(params, "experts.down_lora_B")};
  DVec yl(static_cast<size_t>(T * l), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      DVec ye = expert_ffn(dims, w, r.ids[t * K + j], xl.data() + t * l);
      for (int64_t c = 0; c < l; ++c) yl[t * l + c] += r.weights[t * K + j] * ye[c];
    }
  out.y = latent ? proj(params, "latent_up_proj", yl, T, l, d, cfg.lora) : yl;

  if (cfg.num_shared > 0) {
    const int64_t S = cfg.num_shared * cfg.shared_ffn;
    DVec g = proj(params, "shared_experts.gate_proj", x, T, d, S, cfg.lora);
    DVec u = proj(params, "shared_experts.up_proj", x, T, d, S, cfg.lora);
    DVec h(g.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = silu_d(g[i]) * u[i];
    DVec ys = proj(params, "shared_experts.down_proj", h, T, S, d, cfg.lora);
    for (size_t i = 0; i < out.y.size(); ++i) out.y[i] += ys[i];
  }
  return out;
}

}  // namespace mt::ref
