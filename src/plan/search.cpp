#include "plan/search.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "ops/moe_rules.h"

namespace mt::plan {

double Hardware::a2a_bw(double bytes) const {
  // Piecewise linear in log(size) between the measured points, flat outside them.
  if (a2a_curve.empty()) return allgather_bw;
  if (bytes <= a2a_curve.front().first) return a2a_curve.front().second;
  for (size_t i = 1; i < a2a_curve.size(); ++i) {
    const auto& [x1, y1] = a2a_curve[i];
    if (bytes <= x1) {
      const auto& [x0, y0] = a2a_curve[i - 1];
      const double f = std::log(bytes / x0) / std::log(x1 / x0);
      return y0 + f * (y1 - y0);
    }
  }
  return a2a_curve.back().second;
}

nlohmann::json Hardware::to_json() const {
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& [b, bw] : a2a_curve) curve.push_back({b, bw});
  return {{"mem_bytes", mem_bytes},
          {"gpus_per_node", gpus_per_node},
          {"peak_flops", peak_flops},
          {"gemm_flops", gemm_flops},
          {"grouped_flops", grouped_flops},
          {"kda_flops", kda_flops},
          {"attn_dense_flops", attn_dense_flops},
          {"attn_sparse_flops", attn_sparse_flops},
          {"indexer_flops", indexer_flops},
          {"allgather_bw", allgather_bw},
          {"reduce_scatter_bw", reduce_scatter_bw},
          {"inter_bw", inter_bw},
          {"a2a_curve", curve}};
}

nlohmann::json StepTime::to_json() const {
  return {{"compute", compute},
          {"a2a", a2a},
          {"a2a_exposed", a2a_exposed},
          {"gather", gather},
          {"total", total}};
}

nlohmann::json Evaluated::to_json() const {
  nlohmann::json j = {{"plan", plan.to_json()},
                      {"memory", memory.to_json()},
                      {"time", time.to_json()},
                      {"tokens_per_s", tokens_per_s},
                      {"mfu", mfu}};
  if (!rejected.empty()) j["rejected"] = rejected;
  return j;
}

nlohmann::json SearchResult::to_json() const {
  nlohmann::json j;
  j["considered"] = considered;
  j["best"] = nlohmann::json::array();
  for (const Evaluated& e : best) j["best"].push_back(e.to_json());
  j["rejections"] = nlohmann::json::array();
  for (const Rejection& r : rejections)
    j["rejections"].push_back(
        {{"reason", r.reason}, {"count", r.count}, {"closest", r.closest.to_json()}});
  j["notes"] = notes;
  nlohmann::json comp;
  for (size_t i = 0; i < kComponents; ++i)
    comp[component_name(static_cast<Component>(i))] = {
        {"params", counts.by_component[i].params}, {"trainable", counts.by_component[i].trainable}};
  j["params"] = {{"total", counts.total},
                 {"trainable", counts.trainable},
                 {"expert", counts.expert},
                 {"active_per_token", counts.active_per_token},
                 {"by_component", comp}};
  j["flops_per_token"] = {{"forward", flops.forward.to_json()},
                          {"train", flops.train.to_json()},
                          {"recompute", flops.recompute.to_json()}};
  return j;
}

std::string invalid_reason(const ModelConfig& cfg, const ParallelPlan& p) {
  std::ostringstream s;
  const int64_t E = cfg.moe.num_experts;
  const bool cpu = p.engine != Engine::Fsdp;  // the distributed CPU engines: whole-world groups
  if (p.world < 1 || p.fsdp < 1 || p.ep < 1 || p.expert_shard < 1 || p.mbs < 1 || p.seq < 1 ||
      p.a2a_chunks < 1)
    s << "every size must be positive";
  else if (p.world % p.fsdp != 0)
    s << "fsdp " << p.fsdp << " does not divide the world " << p.world;
  else if (const std::string ep = ops::expert_parallel_error(p.ep, E, p.world); !ep.empty())
    s << ep;
  else if (p.replicas * p.ep != p.world)
    s << "replicas " << p.replicas << " x ep " << p.ep << " != world " << p.world;
  else if (p.replicas % p.expert_shard != 0)
    s << "expert_shard " << p.expert_shard << " does not divide the " << p.replicas
      << " expert replicas";
  else if (cpu && p.fsdp != p.world)
    s << "the " << engine_name(p.engine) << " engine shards over the whole world (fsdp " << p.fsdp
      << " != world " << p.world << ")";
  else if (cpu && p.expert_shard != 1 && p.expert_shard != p.replicas)
    s << "the " << engine_name(p.engine) << " engine shards expert state over all " << p.replicas
      << " replicas or none (expert_shard " << p.expert_shard << ")";
  return s.str();
}

namespace {

int64_t moe_layers(const ModelConfig& cfg) {
  int64_t n = 0;
  for (const LayerIR& l : cfg.layers) n += l.ffn == FfnKind::Moe;
  return n;
}

// Seconds for `bytes` leaving each rank of a collective over `group` ranks of which `per_node`
// share a node: the in-node share over `intra` bytes/s, the rest over the inter-node link,
// whichever is slower (a hierarchical collective's bottleneck).
double group_time(double bytes, int64_t group, int64_t per_node, double intra, double inter) {
  if (group <= 1 || bytes <= 0) return 0;
  per_node = std::clamp<int64_t>(per_node, 1, group);
  if (per_node >= group) return bytes / intra;
  const double in = static_cast<double>(per_node - 1) / static_cast<double>(group - 1);
  return std::max(bytes * in / intra, bytes * (1 - in) / inter);
}

// Members of a group of `group` ranks spaced `stride` apart that share one node.
int64_t per_node(int64_t group, int64_t stride, int64_t gpn) {
  return std::clamp<int64_t>(gpn / stride, 1, group);
}

}  // namespace

namespace {

Evaluated evaluate_with(const ModelConfig& cfg, const ParamCounts& c,
                        const std::vector<BlockActs>& acts, const StepFlops& f,
                        const ParallelPlan& p, const Hardware& hw, const SearchOptions& o) {
  const std::string bad = invalid_reason(cfg, p);
  MT_CHECK(bad.empty(), ValueError, "invalid plan: ", bad);
  Evaluated e;
  e.plan = p;
  e.memory = predict_memory(cfg, c, acts, p, o.memory);
  const double T = static_cast<double>(p.tokens());
  const BytesPerElement dt = bytes_per_element(o.memory.precision);
  const double cap = p.ep > 1 ? o.memory.a2a_capacity : 1.0;

  // Compute: every kind at its own rate; the most loaded EP rank sets the expert time.
  const Flops w = f.train;
  Flops all = w;
  all += f.recompute;
  StepTime t;
  const double expert_time = all.expert_gemm * T / hw.grouped_flops * cap;
  t.compute = all.dense_gemm * T / hw.gemm_flops + expert_time + all.kda_core * T / hw.kda_flops +
              all.attn_dense * T / hw.attn_dense_flops +
              all.attn_sparse * T / hw.attn_sparse_flops + all.indexer * T / hw.indexer_flops;

  // All-to-all: dispatch + combine in forward and in backward (and again when recompute replays
  // the FFN: selective and full), per MoE layer. Chunks pipeline it with the expert GEMMs.
  const int64_t Lm = moe_layers(cfg);
  if (p.ep > 1 && Lm > 0) {
    const double ep = static_cast<double>(p.ep);
    const double bytes =
        T * static_cast<double>(cfg.moe.top_k * cfg.moe.latent) * dt.act * cap * (ep - 1) / ep;
    const double chunks = static_cast<double>(p.a2a_chunks);
    const double one =
        group_time(bytes, p.ep, hw.gpus_per_node, hw.a2a_bw(bytes / chunks), hw.inter_bw) +
        hw.collective_latency * chunks;
    const bool replay = p.recompute != Recompute::None;
    const double passes = replay ? 3 : 2;
    t.a2a = static_cast<double>(Lm) * passes * 2 * one;
    // Expert compute per layer and pass, which the pipeline can hide the exchange behind.
    const double fwd_e =
        f.forward.expert_gemm * T / hw.grouped_flops * cap / static_cast<double>(Lm);
    const double bwd_e = (w.expert_gemm - f.forward.expert_gemm) * T / hw.grouped_flops * cap /
                         static_cast<double>(Lm);
    double hidden = std::min(2 * one, fwd_e) + std::min(2 * one, bwd_e);
    if (replay) hidden += std::min(2 * one, fwd_e);
    hidden *= (chunks - 1) / chunks * static_cast<double>(Lm);
    t.a2a_exposed = std::max(0.0, t.a2a - hidden);
  }

  // Gathers and gradient reductions run on their own stream, prefetched under compute.
  const double dense = static_cast<double>(c.total - c.expert);
  const double dense_tr = static_cast<double>(c.trainable - c.expert_trainable);
  const int64_t gpn = hw.gpus_per_node;
  if (p.fsdp > 1) {
    const double frac = static_cast<double>(p.fsdp - 1) / static_cast<double>(p.fsdp);
    const double ag = dense * dt.weight * frac, rs = dense_tr * dt.grad * frac;
    const int64_t pn = per_node(p.fsdp, 1, gpn);
    // Gathered for forward, then again for backward (resharded after forward).
    t.gather += 2 * group_time(ag, p.fsdp, pn, hw.allgather_bw, hw.inter_bw) +
                group_time(rs, p.fsdp, pn, hw.reduce_scatter_bw, hw.inter_bw);
    t.gather += 2 * static_cast<double>(cfg.layers.size()) * hw.collective_latency;
  }
  const int64_t dense_dp = p.world / p.fsdp;
  if (dense_dp > 1) {
    // Replicated dense shards: all-reduce (2x) of the trainable gradients across them.
    const double d = static_cast<double>(dense_dp);
    const double b = 2 * dense_tr / static_cast<double>(p.fsdp) * dt.grad * (d - 1) / d;
    t.gather +=
        group_time(b, dense_dp, per_node(dense_dp, p.fsdp, gpn), hw.allgather_bw, hw.inter_bw);
  }
  if (Lm > 0) {
    const double local = static_cast<double>(c.expert) / static_cast<double>(p.ep);
    const double local_tr = static_cast<double>(c.expert_trainable) / static_cast<double>(p.ep);
    // The replicas sharding one expert slice sit ep ranks apart.
    if (p.expert_shard > 1) {
      const double es = static_cast<double>(p.expert_shard);
      const double frac = (es - 1) / es;
      const int64_t pn = per_node(p.expert_shard, p.ep, gpn);
      t.gather += 2 * group_time(local * dt.weight * frac, p.expert_shard, pn, hw.allgather_bw,
                                 hw.inter_bw) +
                  group_time(local_tr * dt.grad * frac, p.expert_shard, pn, hw.reduce_scatter_bw,
                             hw.inter_bw);
    }
    const int64_t edp = p.replicas / p.expert_shard;
    if (edp > 1) {
      const double d = static_cast<double>(edp);
      t.gather +=
          group_time(2 * local_tr / static_cast<double>(p.expert_shard) * dt.grad * (d - 1) / d,
                     edp, per_node(edp, p.ep * p.expert_shard, gpn), hw.allgather_bw, hw.inter_bw);
    }
  }
  t.total = std::max(t.compute + t.a2a_exposed, t.gather);
  e.time = t;
  e.tokens_per_s = static_cast<double>(p.world) * T / t.total;
  e.mfu = w.total() * e.tokens_per_s / (static_cast<double>(p.world) * hw.peak_flops);
  if (e.memory.total() > hw.mem_bytes) {
    std::ostringstream s;
    s.precision(1);
    s << std::fixed << "needs " << e.memory.total() / 1e9 << " GB > " << hw.mem_bytes / 1e9
      << " GB";
    e.rejected = s.str();
  }
  return e;
}

}  // namespace

Evaluated evaluate(const ModelConfig& cfg, const ParamCounts& counts,
                   const std::vector<BlockActs>& acts, const ParallelPlan& p, const Hardware& hw,
                   const SearchOptions& o) {
  return evaluate_with(cfg, counts, acts,
                       flops_per_token(cfg, p.seq, o.memory.freeze_base, p.recompute), p, hw, o);
}

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// The memory part that dominates a rejected plan: its rejection group.
std::string dominant(const MemoryBreakdown& m) {
  std::vector<std::pair<double, const char*>> parts = {
      {m.weights, "weights"},         {m.grads + m.master + m.optimizer, "gradients+optimizer"},
      {m.activations, "activations"}, {m.fsdp_buffers + m.expert_buffers, "gather buffers"},
      {m.a2a_buffers, "a2a buffers"}, {m.workspace, "workspace"}};
  return std::max_element(parts.begin(), parts.end())->second;
}

std::string describe(const ParallelPlan& p) {
  std::ostringstream s;
  s << "fsdp " << p.fsdp << ", ep " << p.ep << ", expert_shard " << p.expert_shard << ", mbs "
    << p.mbs << ", recompute " << recompute_name(p.recompute) << ", a2a_chunks " << p.a2a_chunks;
  if (p.engine != Engine::Fsdp) s << ", engine " << engine_name(p.engine);
  return s.str();
}

}  // namespace

SearchResult search(const ModelConfig& cfg, int64_t world, const Hardware& hw,
                    const SearchOptions& o) {
  MT_CHECK(world >= 1, ValueError, "--gpus must be at least 1, got ", world);
  MT_CHECK(o.seq >= 1, ValueError, "--seq must be positive, got ", o.seq);
  MT_CHECK(hw.gpus_per_node >= 1, ValueError, "--gpus-per-node must be positive");
  const int64_t E = cfg.moe.num_experts;
  // Fixed choices are checked up front so the message names the rule, not "no plan fits".
  if (o.ep) {
    ParallelPlan p{.world = world, .ep = *o.ep, .replicas = world / std::max<int64_t>(*o.ep, 1)};
    p.fsdp = o.fsdp.value_or(1);
    const std::string bad = invalid_reason(cfg, p);
    MT_CHECK(bad.empty(), ValueError, "cannot use --ep ", *o.ep, ": ", bad);
  }
  if (o.fsdp)
    MT_CHECK(*o.fsdp >= 1 && world % *o.fsdp == 0, ValueError, "cannot use --fsdp ", *o.fsdp,
             ": it must divide --gpus ", world);
  const bool cpu = o.engine != Engine::Fsdp;
  if (cpu)
    MT_CHECK(!o.fsdp || *o.fsdp == world, ValueError, "cannot use --fsdp ", *o.fsdp, " with the ",
             engine_name(o.engine), " engine: it shards over the whole world");
  if (o.mbs) MT_CHECK(*o.mbs >= 1, ValueError, "--mbs must be positive, got ", *o.mbs);

  SearchResult r;
  r.counts = count_params(cfg, o.memory.freeze_base, o.memory.precision);
  std::vector<int64_t> eps;
  for (int64_t d : divisors(world))
    if ((o.ep && d == *o.ep) || (!o.ep && (E > 0 ? E % d == 0 : d == 1))) eps.push_back(d);
  std::vector<int64_t> fsdps = o.fsdp ? std::vector<int64_t>{*o.fsdp}
                               : cpu  ? std::vector<int64_t>{world}
                                      : divisors(world);
  std::vector<int64_t> mbss =
      o.mbs ? std::vector<int64_t>{*o.mbs} : std::vector<int64_t>{1, 2, 4, 8};
  std::vector<Recompute> recs =
      o.recompute ? std::vector<Recompute>{*o.recompute}
                  : std::vector<Recompute>{Recompute::None, Recompute::Selective, Recompute::Full};
  std::map<Recompute, StepFlops> flops;
  for (Recompute rc : recs) flops[rc] = flops_per_token(cfg, o.seq, o.memory.freeze_base, rc);
  std::map<int64_t, std::vector<BlockActs>> acts;
  for (int64_t m : mbss)
    acts[m] = block_activations(cfg, m, o.seq, o.memory.precision.activations, o.memory.device);

  std::vector<Evaluated> all;
  for (int64_t ep : eps)
    for (int64_t es : divisors(world / ep)) {
      if (o.expert_shard && es != *o.expert_shard) continue;
      if (cpu && es != 1 && es != world / ep) continue;
      for (int64_t fsdp : fsdps)
        for (int64_t mbs : mbss)
          for (Recompute rc : recs)
            for (int64_t ch : std::vector<int64_t>{1, 2, 4, 8}) {
              if (o.a2a_chunks ? ch != *o.a2a_chunks : (ep == 1 && ch > 1)) continue;
              ParallelPlan p{.world = world,
                             .gpus_per_node = hw.gpus_per_node,
                             .fsdp = fsdp,
                             .ep = ep,
                             .replicas = world / ep,
                             .expert_shard = es,
                             .mbs = mbs,
                             .seq = o.seq,
                             .recompute = rc,
                             .a2a_chunks = ch,
                             .engine = o.engine};
              all.push_back(evaluate_with(cfg, r.counts, acts[mbs], flops[rc], p, hw, o));
            }
    }
  r.considered = static_cast<int64_t>(all.size());
  MT_CHECK(!all.empty(), ValueError, "no plan satisfies the fixed options (--ep ", o.ep.value_or(0),
           ", --expert-shard ", o.expert_shard.value_or(0), ")");

  std::vector<const Evaluated*> ok;
  std::map<std::string, SearchResult::Rejection> groups;
  for (const Evaluated& e : all) {
    if (e.rejected.empty()) {
      ok.push_back(&e);
      continue;
    }
    const std::string key = "over memory, largest part " + dominant(e.memory);
    SearchResult::Rejection& g = groups[key];
    if (g.count == 0 || e.memory.total() < g.closest.memory.total()) g.closest = e;
    g.reason = key;
    ++g.count;
  }
  for (auto& [k, g] : groups) r.rejections.push_back(g);
  std::sort(r.rejections.begin(), r.rejections.end(),
            [](const auto& a, const auto& b) { return a.count > b.count; });
  // Throughput decides (plans differ in tokens per step); less memory breaks ties.
  std::sort(ok.begin(), ok.end(), [](const Evaluated* a, const Evaluated* b) {
    if (a->tokens_per_s != b->tokens_per_s) return a->tokens_per_s > b->tokens_per_s;
    return a->memory.total() < b->memory.total();
  });
  for (size_t i = 0; i < ok.size() && i < static_cast<size_t>(o.keep); ++i)
    r.best.push_back(*ok[i]);
  r.flops = flops_per_token(cfg, o.seq, o.memory.freeze_base,
                            ok.empty() ? Recompute::None : ok.front()->plan.recompute);
  if (ok.empty()) return r;

  // Why the winner: for each knob, the best plan with each other value of it.
  const Evaluated& best = *ok.front();
  struct Knob {
    const char* name;
    int64_t (*get)(const ParallelPlan&);
  };
  const Knob knobs[] = {
      {"ep", [](const ParallelPlan& p) { return p.ep; }},
      {"expert_shard", [](const ParallelPlan& p) { return p.expert_shard; }},
      {"fsdp", [](const ParallelPlan& p) { return p.fsdp; }},
      {"mbs", [](const ParallelPlan& p) { return p.mbs; }},
      {"recompute", [](const ParallelPlan& p) { return static_cast<int64_t>(p.recompute); }},
      {"a2a_chunks", [](const ParallelPlan& p) { return p.a2a_chunks; }},
  };
  for (const Knob& k : knobs) {
    std::map<int64_t, const Evaluated*> fit, closest;
    for (const Evaluated& e : all) {
      const int64_t v = k.get(e.plan);
      if (v == k.get(best.plan)) continue;
      if (e.rejected.empty()) {
        if (!fit[v] || e.tokens_per_s > fit[v]->tokens_per_s) fit[v] = &e;
      } else if (!closest[v] || e.memory.total() < closest[v]->memory.total()) {
        closest[v] = &e;
      }
    }
    std::set<int64_t> values;
    for (const auto& kv : fit) values.insert(kv.first);
    for (const auto& kv : closest) values.insert(kv.first);
    for (int64_t v : values) {
      std::ostringstream s;
      s.precision(1);
      s << std::fixed;
      s << k.name << " "
        << (k.name == std::string("recompute") ? recompute_name(static_cast<Recompute>(v))
                                               : std::to_string(v))
        << ": ";
      if (auto it = fit.find(v); it != fit.end()) {
        const Evaluated& e = *it->second;
        s << "best such plan " << (1 - e.tokens_per_s / best.tokens_per_s) * 100
          << "% fewer tokens/s (" << describe(e.plan) << "; compute " << e.time.compute
          << " s, a2a exposed " << e.time.a2a_exposed << " s, gathers " << e.time.gather << " s)";
      } else {
        const Evaluated& c = *closest.at(v);
        s << "never fits; closest needs " << c.memory.total() / 1e9 << " GB (" << describe(c.plan)
          << ", largest part " << dominant(c.memory) << ")";
      }
      r.notes.push_back(s.str());
    }
  }
  return r;
}

}  // namespace mt::plan
