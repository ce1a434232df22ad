#include "plan/report.h"

#include "plan/auto_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

namespace mt::plan {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string gb(double b) {
  // Small models (CPU plans) would read 0.0 at one decimal.
  return fmt(b >= 1e9 || b == 0 ? "%.1f" : "%.4f", b / 1e9);
}

std::string params_str(double n) {
  if (n >= 1e12) return fmt("%.3fT", n / 1e12);
  if (n >= 1e9) return fmt("%.2fB", n / 1e9);
  if (n >= 1e6) return fmt("%.2fM", n / 1e6);
  return fmt("%.0f", n);
}

std::string plan_cells(const Evaluated& e, const char* sep) {
  const ParallelPlan& p = e.plan;
  const MemoryBreakdown& m = e.memory;
  std::string s;
  auto cell = [&](const std::string& v) { s += v + sep; };
  cell(std::to_string(p.fsdp));
  cell(std::to_string(p.ep));
  cell(std::to_string(p.replicas));
  cell(std::to_string(p.expert_shard));
  cell(std::to_string(p.mbs));
  cell(recompute_name(p.recompute));
  cell(std::to_string(p.a2a_chunks));
  cell(gb(m.weights));
  cell(gb(m.grads + m.master));
  cell(gb(m.optimizer));
  cell(gb(m.activations));
  cell(gb(m.fsdp_buffers + m.expert_buffers + m.a2a_buffers + m.workspace));
  cell(gb(m.total()));
  cell(fmt("%.2f", e.time.total));
  cell(fmt("%.0f", e.tokens_per_s));
  s += fmt("%.1f%%", 100 * e.mfu);
  return s;
}

const char* kHeader[] = {"fsdp",     "ep",      "repl",  "eshard", "mbs",  "recompute",
                         "chunks",   "weights", "grads", "optim",  "acts", "buffers",
                         "total GB", "step s",  "tok/s", "MFU"};

std::string lora_str(const SearchOptions& o) {
  if (!o.memory.freeze_base) return "full fine-tuning";
  std::string s = "LoRA rank " + std::to_string(o.lora.rank) + " (base frozen)";
  if (o.lora.expert_rank > 0) s += ", expert LoRA rank " + std::to_string(o.lora.expert_rank);
  return s;
}

}  // namespace

int64_t devices_for_weights(int64_t params, double bytes_per_param, double mem_bytes) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(params) * bytes_per_param / mem_bytes));
}

namespace {
std::vector<std::pair<std::string, std::array<int64_t, 3>>> acts_per_token(const PlanReport& r);
}  // namespace

PlanReport run_plan(const PlanRequest& req) {
  PlanReport r{req, search(req.cfg, req.world, req.hw, req.options),
               match_kernels(req.cfg, req.backend, req.backend == Backend::Cuda ? "bf16" : "fp32")};
  return r;
}

nlohmann::json report_json(const PlanReport& r) {
  nlohmann::json j = r.result.to_json();
  j["model"] = r.request.model_name;
  j["world"] = r.request.world;
  j["hardware"] = r.request.hw.to_json();
  j["seq"] = r.request.options.seq;
  j["lora_rank"] = r.request.options.lora.rank;
  j["expert_lora_rank"] = r.request.options.lora.expert_rank;
  j["full_finetune"] = !r.request.options.memory.freeze_base;
  j["devices_for_one_weight_replica"] = devices_for_weights(
      r.result.counts.total, bytes_per_element(r.request.options.memory.precision).weight,
      r.request.hw.mem_bytes);
  nlohmann::json k = nlohmann::json::array();
  for (const KernelChoice& c : r.kernels)
    k.push_back({{"layer", c.layer},
                 {"op", op_name(c.op)},
                 {"kernel", c.kernel},
                 {"fallback", c.fallback},
                 {"why", c.why}});
  j["kernels"] = k;
  if (!r.result.best.empty()) {
    const PlanJob pj = plan_job(r.result.best.front().plan);
    j["job"] = {{"ep", pj.ep},
                {"a2a_chunks", pj.a2a_chunks},
                {"fsdp", pj.fsdp},
                {"shard_experts", pj.shard_experts},
                {"shard_expert_weights", pj.shard_expert_weights},
                {"recompute", recompute_name(pj.recompute)},
                {"batch", pj.batch},
                {"set", pj.set_args()},
                {"unsupported", pj.unsupported}};
  }
  j["backend"] = backend_name(r.request.backend);
  nlohmann::json a;
  for (const auto& [kind, v] : acts_per_token(r))
    a[kind] = {{"none", v[0]}, {"selective", v[1]}, {"full", v[2]}};
  j["activation_bytes_per_token"] = a;
  return j;
}

namespace {

// Saved activation bytes per token of each distinct block kind under each recompute policy.
std::vector<std::pair<std::string, std::array<int64_t, 3>>> acts_per_token(const PlanReport& r) {
  const PlanRequest& q = r.request;
  std::vector<std::pair<std::string, std::array<int64_t, 3>>> out;
  const double scale = 1.0 / static_cast<double>(q.options.seq);
  for (const BlockActs& b :
       block_activations(q.cfg, 1, q.options.seq, q.options.memory.precision.activations,
                         q.options.memory.device)) {
    const std::string kind =
        std::string(mixer_name(b.mixer)) + (b.ffn == FfnKind::Dense ? "+ffn" : "+moe");
    bool seen = false;
    for (const auto& o : out) seen |= o.first == kind;
    if (seen) continue;
    std::array<int64_t, 3> v{};
    const Recompute rs[] = {Recompute::None, Recompute::Selective, Recompute::Full};
    for (size_t i = 0; i < 3; ++i)
      v[i] = static_cast<int64_t>(static_cast<double>(b.saved(rs[i])) * scale);
    out.push_back({kind, v});
  }
  return out;
}

void summary(std::ostream& os, const PlanReport& r, bool md) {
  const PlanRequest& q = r.request;
  const ParamCounts& c = r.result.counts;
  const double wb = bytes_per_element(q.options.memory.precision).weight;
  const char* b = md ? "- " : "";
  os << b << "model " << q.model_name << " on " << q.world << " devices of " << gb(q.hw.mem_bytes)
     << " GB (" << q.hw.gpus_per_node << " per node), seq " << q.options.seq << ", "
     << lora_str(q.options) << "\n";
  os << b << "parameters: " << params_str(static_cast<double>(c.total))
     << " total = " << fmt("%.2f", static_cast<double>(c.total) * wb / 1e12) << " TB at " << wb
     << " B/param; routed experts " << params_str(static_cast<double>(c.expert)) << "; other "
     << params_str(static_cast<double>(c.total - c.expert)) << "; trainable "
     << params_str(static_cast<double>(c.trainable)) << "; active per token "
     << params_str(static_cast<double>(c.active_per_token)) << "\n";
  os << b << "one replica of the weights alone needs "
     << devices_for_weights(c.total, wb, q.hw.mem_bytes) << " devices of " << gb(q.hw.mem_bytes)
     << " GB\n";
  const StepFlops& f = r.result.flops;
  os << b << "FLOPs per token: forward " << fmt("%.1f", f.forward.total() / 1e9) << " G, train "
     << fmt("%.1f", f.train.total() / 1e9) << " G (+" << fmt("%.1f", f.recompute.total() / 1e9)
     << " G recompute at the chosen policy)\n";
  os << b << "activation bytes per token per block (stored as "
     << dtype_name(q.options.memory.precision.activations)
     << ", statistics fp32; none / selective / full recompute):";
  for (const auto& [kind, v] : acts_per_token(r))
    os << " " << kind << " " << v[0] << " / " << v[1] << " / " << v[2] << ";";
  os << "\n";
  os << b << "considered " << r.result.considered << " plans, " << r.result.best.size()
     << " listed\n";
}

void print_kernels(std::ostream& os, const PlanReport& r, bool md) {
  // One line per layer kind (op=kernel, * = fallback), then each distinct fallback reason once.
  os << (md ? "\nKernels (" : "kernels (") << backend_name(r.request.backend)
     << (md ? "), `*` = fallback:\n\n" : "), * = fallback:\n");
  std::vector<std::string> layers, reasons;
  for (const KernelChoice& k : r.kernels)
    if (std::find(layers.begin(), layers.end(), k.layer) == layers.end()) layers.push_back(k.layer);
  for (const std::string& l : layers) {
    os << (md ? "- " : "  ") << l << ":";
    for (const KernelChoice& k : r.kernels) {
      if (k.layer != l) continue;
      os << " " << op_name(k.op) << "=" << k.kernel << (k.fallback ? "*" : "");
      const std::string why = std::string(op_name(k.op)) + ": " + k.why;
      if (k.fallback && std::find(reasons.begin(), reasons.end(), why) == reasons.end())
        reasons.push_back(why);
    }
    os << "\n";
  }
  for (const std::string& w : reasons)
    os << (md ? "- warning: " : "  warning: ") << w << " -> falls back to the CPU kernel\n";
}

}  // namespace

void print_text(std::ostream& os, const PlanReport& r) {
  summary(os, r, false);
  const SearchResult& s = r.result;
  os << "\n#  ";
  for (const char* h : kHeader) os << h << "  ";
  os << "\n";
  for (size_t i = 0; i < s.best.size(); ++i)
    os << i + 1 << "  " << plan_cells(s.best[i], "  ") << "\n";
  if (s.best.empty()) {
    os << "no plan fits in " << gb(r.request.hw.mem_bytes) << " GB per device.\n";
  } else {
    const Evaluated& b = s.best.front();
    os << "\nchosen: plan 1 — compute " << fmt("%.2f", b.time.compute) << " s, all-to-all "
       << fmt("%.2f", b.time.a2a) << " s (" << fmt("%.2f", b.time.a2a_exposed)
       << " s exposed), gathers/reductions " << fmt("%.2f", b.time.gather)
       << " s (overlapped); memory: weights " << gb(b.memory.weights) << ", grads "
       << gb(b.memory.grads) << ", master " << gb(b.memory.master) << ", optimizer "
       << gb(b.memory.optimizer) << ", activations " << gb(b.memory.activations) << ", fsdp "
       << gb(b.memory.fsdp_buffers) << ", expert gather " << gb(b.memory.expert_buffers) << ", a2a "
       << gb(b.memory.a2a_buffers) << ", workspace " << gb(b.memory.workspace) << " GB\n";
    const PlanJob pj = plan_job(b.plan);
    os << "job keys for plan 1 (moetrain train on " << pj.world << " ranks): " << pj.set_args()
       << (pj.unsupported.empty() ? "" : "; the engine cannot run it: " + pj.unsupported) << "\n";
    os << "alternatives:\n";
    for (const std::string& n : s.notes) os << "  " << n << "\n";
  }
  os << "rejected:\n";
  for (const auto& g : s.rejections) {
    const ParallelPlan& p = g.closest.plan;
    os << "  " << g.count << " plans " << g.reason << "; closest: fsdp " << p.fsdp << ", ep "
       << p.ep << ", expert_shard " << p.expert_shard << ", mbs " << p.mbs << ", recompute "
       << recompute_name(p.recompute) << " at " << gb(g.closest.memory.total()) << " GB\n";
  }
  print_kernels(os, r, false);
}

void print_markdown(std::ostream& os, const PlanReport& r) {
  summary(os, r, true);
  const SearchResult& s = r.result;
  os << "\n| # | ";
  for (const char* h : kHeader) os << h << " | ";
  os << "\n|";
  for (size_t i = 0; i <= std::size(kHeader); ++i) os << " --- |";
  os << "\n";
  for (size_t i = 0; i < s.best.size(); ++i)
    os << "| " << i + 1 << " | " << plan_cells(s.best[i], " | ") << " |\n";
  if (s.best.empty()) {
    os << "\n**No plan fits in " << gb(r.request.hw.mem_bytes) << " GB.**\n";
  } else {
    const PlanJob pj = plan_job(s.best.front().plan);
    os << "\nPlan 1 as job keys for `moetrain train` on " << pj.world << " ranks: `"
       << pj.set_args() << "`"
       << (pj.unsupported.empty() ? "" : " (the engine cannot run it: " + pj.unsupported + ")")
       << ".\n";
  }
  if (!s.notes.empty()) {
    os << "\nAlternatives to plan 1:\n\n";
    for (const std::string& n : s.notes) os << "- " << n << "\n";
  }
  if (!s.rejections.empty()) {
    os << "\nRejected:\n\n";
    for (const auto& g : s.rejections) {
      const ParallelPlan& p = g.closest.plan;
      os << "- " << g.count << " plans " << g.reason << "; closest: fsdp " << p.fsdp << ", ep "
         << p.ep << ", expert_shard " << p.expert_shard << ", mbs " << p.mbs << ", recompute "
         << recompute_name(p.recompute) << " at " << gb(g.closest.memory.total()) << " GB\n";
    }
  }
  print_kernels(os, r, true);
  os << "\n";
}

}  // namespace mt::plan
