#include "parallel/balance/train_balancer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "ops/moe_rules.h"
#include "ops/overflow_route.h"
#include "parallel/balance/routing_sim.h"
#include "parallel/comm.h"

namespace mt::balance {

TrainBalancer::TrainBalancer(const BalanceOptions& opt, Model& model, int64_t ep_ranks,
                             par::Comm* world)
    : opt_(opt), model_(model), P_(ep_ranks), world_(world) {
  MT_CHECK(!opt.placement || opt.placement_every > 0, ConfigError,
           "balance.placement needs balance.placement_every > 0 (optimizer steps between moves)");
  const MoeConfig& mc = model.config().moe;
  const int64_t E = mc.num_experts;
  std::vector<MoeLayer*> layers = model.moe_layers();
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i]) moe_layer_.push_back(static_cast<int>(i));
  MT_CHECK(!moe_layer_.empty() || !opt.any(), ConfigError,
           "[balance] switches need a model with MoE layers");
  if (moe_layer_.empty()) return;
  const std::string ep = ops::expert_parallel_error(P_, E);
  MT_CHECK(ep.empty(), ConfigError, "balance: ", ep);
  const std::vector<int32_t> expert_rank = ops::contiguous_expert_ranks(E, P_);

  if (opt.overflow) {
    MT_CHECK(mc.top_k + opt.candidates <= E, ConfigError, "balance.candidates = ", opt.candidates,
             ": top_k ", mc.top_k, " + candidates exceeds the ", E, " experts");
    const ops::OverflowParams p{.extra = opt.candidates,
                                .expert_capacity = static_cast<float>(opt.capacity),
                                .rank_capacity = static_cast<float>(opt.rank_capacity),
                                .max_reroute_share = static_cast<float>(opt.reroute_budget)};
    for (int i : moe_layer_) layers[static_cast<size_t>(i)]->set_overflow_policy(p, expert_rank);
    overflow_params_ = p;
    overflow_set_ = true;
  }
  if (opt.predict || opt.compensate || opt.placement)
    predictor_ = std::make_unique<LoadPredictor>(
        static_cast<int64_t>(moe_layer_.size()), expert_rank,
        PredictorOptions{.ema_alpha = opt.ema_alpha, .window = opt.window});
  if (!opt.trace.empty()) {
    const int64_t W = std::min<int64_t>(E, mc.top_k + std::max<int64_t>(opt.candidates, 0));
    width_ = W;
    for (int i : moe_layer_) layers[static_cast<size_t>(i)]->set_trace_width(W);
    if (!world_ || world_->rank() == 0)
      trace_ = std::make_unique<TraceWriter>(opt.trace, TraceHeader{E, mc.top_k, W});
  }
  if (!opt.skew_experts.empty()) {
    MT_CHECK(mc.selection_bias, ConfigError,
             "balance.skew_experts needs a router with a selection bias (topk_method noaux_tc)");
    for (int i : moe_layer_) {
      Param& b = model.params().at("model.layers." + std::to_string(i) +
                                   ".mlp.gate.e_score_correction_bias");
      for (int64_t e : opt.skew_experts) {
        MT_CHECK(e >= 0 && e < E, ConfigError, "balance.skew_experts: expert ", e, " of ", E);
        b.value.f32()[e] += static_cast<float>(opt.skew_bias);
      }
    }
  }
}

TrainBalancer::~TrainBalancer() = default;

void TrainBalancer::after_forward(int64_t step) {
  std::vector<MoeLayer*> layers = model_.moe_layers();
  for (int i : moe_layer_) {
    const ops::OverflowStats& s = layers[static_cast<size_t>(i)]->last_overflow();
    rerouted_ += s.rerouted;
    shed_ += s.shed;
    pairs_ += s.pairs;
  }
  if (opt_.trace.empty()) return;
  for (int i : moe_layer_) {
    const MoeLayer& m = *layers[static_cast<size_t>(i)];
    std::vector<int32_t> cand = m.trace_candidates();
    std::vector<float> prio = m.trace_priorities();
    if (world_ && world_->size() > 1) {
      // Every rank holds the same token count (DistTrainer checks it), so one all-gather each.
      const auto n = static_cast<int64_t>(cand.size());
      std::vector<int32_t> all_c(cand.size() * static_cast<size_t>(world_->size()));
      std::vector<float> all_p(all_c.size());
      world_->all_gather(cand.data(), n, all_c.data(), par::Elem::I32);
      world_->all_gather(prio.data(), n, all_p.data(), par::Elem::F32);
      cand.swap(all_c);
      prio.swap(all_p);
    }
    if (!trace_) continue;
    const auto tokens = static_cast<int64_t>(cand.size()) / width_;
    TraceStep ts{.step = step,
                 .layer = i,
                 .tokens = tokens,
                 .cand = std::move(cand),
                 .score = std::move(prio)};
    trace_->write(ts);
  }
}

int TrainBalancer::after_step(const std::vector<std::vector<int64_t>>& loads) {
  if (!predictor_) return 0;
  for (size_t j = 0; j < moe_layer_.size(); ++j) {
    const auto i = static_cast<size_t>(moe_layer_[j]);
    if (i < loads.size() && !loads[i].empty())
      predictor_->observe(static_cast<int64_t>(j), loads[i]);
  }
  // The hottest layer decides: every layer shares one exchange setting, and the slowest
  // layer's idle time is what the step pays.
  imbalance_ = 1;
  double hot_rows = 0;
  for (size_t j = 0; j < moe_layer_.size(); ++j) {
    imbalance_ =
        std::max(imbalance_, predictor_->predicted_rank_imbalance(static_cast<int64_t>(j)));
    const std::vector<double> r = predictor_->rank_forecast(static_cast<int64_t>(j));
    hot_rows = std::max(hot_rows, *std::max_element(r.begin(), r.end()));
  }
  if (!opt_.compensate) return 0;
  const MoeConfig& mc = model_.config().moe;
  // Rows the hottest rank receives (its experts' pairs) come mostly from other ranks and go back
  // after the experts: two transfers of 4-byte rows, and 3 GEMMs of 2 l F FLOPs each forward.
  const double remote = P_ > 1 ? static_cast<double>(P_ - 1) / static_cast<double>(P_) : 0;
  const double a2a =
      2 * hot_rows * remote * static_cast<double>(mc.latent) * 4 / (opt_.link_gbs * 1e9);
  const double compute =
      hot_rows * 6 * static_cast<double>(mc.latent * mc.expert_ffn) / (opt_.gflops * 1e9);
  chunks_ = chunks_for_forecast(a2a, compute, 2 * opt_.latency_us * 1e-6,
                                static_cast<int>(opt_.max_chunks));
  return chunks_;
}

std::vector<std::vector<int32_t>> TrainBalancer::placement(int64_t step) {
  if (!opt_.placement || !predictor_ || step % opt_.placement_every != 0) return {};
  std::vector<MoeLayer*> layers = model_.moe_layers();
  std::vector<std::vector<int32_t>> out(layers.size());
  for (size_t j = 0; j < moe_layer_.size(); ++j) {
    if (predictor_->steps_seen(static_cast<int64_t>(j)) == 0) continue;
    const auto i = static_cast<size_t>(moe_layer_[j]);
    out[i] = greedy_placement(predictor_->forecast(static_cast<int64_t>(j)), P_);
    predictor_->set_expert_rank(static_cast<int64_t>(j), out[i]);
    if (overflow_set_) layers[i]->set_overflow_policy(overflow_params_, out[i]);
  }
  return out;
}

void TrainBalancer::add_metrics(nlohmann::json& line) {
  int64_t v[3] = {rerouted_, shed_, pairs_};
  if (world_ && world_->size() > 1)
    for (int64_t& x : v) x = world_->all_reduce_sum(x);
  rerouted_ = shed_ = pairs_ = 0;
  nlohmann::json b = nlohmann::json::object();
  if (opt_.overflow) {
    b["rerouted_share"] = v[2] > 0 ? static_cast<double>(v[0]) / static_cast<double>(v[2]) : 0.0;
    b["shed_share"] = v[2] > 0 ? static_cast<double>(v[1]) / static_cast<double>(v[2]) : 0.0;
  }
  if (predictor_) b["forecast_imbalance"] = imbalance_;
  if (opt_.compensate) b["chunks"] = chunks_;
  if (!b.empty()) line["balance"] = b;
}

}  // namespace mt::balance
