#include "train/job.h"

#include <toml++/toml.h>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "core/device.h"
#include "core/error.h"
#include "io/hf_names.h"
#include "model/vision/vision_front.h"
#include "ops/grouped_matmul.h"
#include "ops/kda.h"

namespace mt {

namespace {

const std::vector<std::string> kLoraGroups = {"attention",        "kda",         "shared_experts",
                                              "routed_experts",   "dense_ffn",   "router",
                                              "vision_projector", "vision_tower"};

constexpr const char* kRouterWeights = "model.layers.*.mlp.gate.weight";

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

// Reads typed values out of a TOML table, remembering which keys it consumed so that everything
// left over can be reported as unknown.
class Reader {
 public:
  Reader(const toml::table& root, std::string source) : root_(root), source_(std::move(source)) {}

  template <typename T>
  void get(const std::string& key, T& out) {
    const toml::node* n = root_.at_path(key).node();
    if (!n) return;
    used_.insert(key);
    if constexpr (std::is_same_v<T, std::string>) {
      auto v = n->value<std::string>();
      if (!n->is_string() || !v) fail(key, "a string", *n);
      out = *v;
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!n->is_boolean()) fail(key, "a boolean", *n);
      out = *n->value<bool>();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!n->is_number()) fail(key, "a number", *n);
      out = static_cast<T>(*n->value<double>());
    } else {
      if (!n->is_integer()) fail(key, "an integer", *n);
      out = static_cast<T>(*n->value<int64_t>());
    }
  }

  void get_list(const std::string& key, std::vector<std::string>& out) {
    const toml::node* n = root_.at_path(key).node();
    if (!n) return;
    used_.insert(key);
    if (!n->is_array()) fail(key, "an array of strings", *n);
    out.clear();
    for (const toml::node& e : *n->as_array()) {
      if (!e.is_string()) fail(key, "an array of strings", e);
      out.push_back(*e.value<std::string>());
    }
  }

  void get_int_list(const std::string& key, std::vector<int64_t>& out) {
    const toml::node* n = root_.at_path(key).node();
    if (!n) return;
    used_.insert(key);
    if (!n->is_array()) fail(key, "an array of integers", *n);
    out.clear();
    for (const toml::node& e : *n->as_array()) {
      if (!e.is_integer()) fail(key, "an array of integers", e);
      out.push_back(*e.value<int64_t>());
    }
  }

  void get_string_map(const std::string& key, std::map<std::string, std::string>& out) {
    const toml::node* n = root_.at_path(key).node();
    if (!n) return;
    used_.insert(key);
    if (!n->is_table()) fail(key, "a table of strings", *n);
    out.clear();
    for (auto&& [k, v] : *n->as_table()) {
      if (!v.is_string()) fail(key + "." + std::string(k.str()), "a string", v);
      out[std::string(k.str())] = *v.value<std::string>();
    }
  }

  bool has(const std::string& key) const { return root_.at_path(key).node() != nullptr; }

  // Every leaf (or consumed table) not read is an unknown key.
  void check_all_used() const { walk(root_, ""); }

 private:
  void walk(const toml::table& t, const std::string& prefix) const {
    for (auto&& [k, v] : t) {
      std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (used_.count(key)) continue;
      if (v.is_table())
        walk(*v.as_table(), key);
      else
        MT_THROW(ConfigError, source_, ": unknown key '", key, "'");
    }
  }
  [[noreturn]] void fail(const std::string& key, const char* want, const toml::node& n) const {
    MT_THROW(ConfigError, source_, ": key '", key, "' must be ", want, ", got ", type_name(n));
  }
  const toml::table& root_;
  std::string source_;
  std::set<std::string> used_;
};

void apply_override(toml::table& root, const std::string& kv, const std::string& source) {
  const size_t eq = kv.find('=');
  MT_CHECK(eq != std::string::npos && eq > 0, ConfigError, "--set '", kv,
           "' must look like key=value");
  const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word is a string
  }
  toml::table* t = &root;
  size_t pos = 0;
  for (size_t dot; (dot = key.find('.', pos)) != std::string::npos; pos = dot + 1) {
    const std::string part = key.substr(pos, dot - pos);
    if (!t->contains(part)) t->insert(part, toml::table{});
    toml::node* n = t->get(part);
    MT_CHECK(n->is_table(), ConfigError, source, ": --set ", key, ": '", part, "' is not a table");
    t = n->as_table();
  }
  t->insert_or_assign(key.substr(pos), *parsed.get("v"));
}

}  // namespace

bool glob_match(const std::string& p, const std::string& s) {
  size_t pi = 0, si = 0, star = std::string::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi;
      ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

Job Job::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  MT_CHECK(in.good(), IoError, "job file '", path, "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path, overrides);
}

Job Job::parse(const std::string& text, const std::string& source,
               const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    MT_THROW(ConfigError, source, ":", e.source().begin.line, ": ", e.description());
  }
  for (const std::string& o : overrides) apply_override(root, o, source);
  Job j;
  Reader r(root, source);
  r.get("run.dir", j.run_dir);
  r.get("run.seed", j.seed);
  r.get("run.threads", j.threads);
  r.get("run.device", j.device);
  r.get("run.deterministic", j.deterministic);
  r.get("model.config", j.model);
  r.get("model.init", j.init);
  r.get("model.dir", j.model_dir);
  if (!j.model_dir.empty()) {
    MT_CHECK(!r.has("model.config") || j.model == j.model_dir, ConfigError, source,
             ": model.config = \"", j.model, "\" and model.dir = \"", j.model_dir,
             "\" disagree (model.dir alone names both the model and its weights)");
    j.model = j.model_dir;
  }
  r.get("model.precision", j.precision);
  r.get("model.vision_tower", j.vision_tower);
  r.get("data.train", j.train_data);
  r.get_string_map("data.eval", j.eval_data);
  r.get("data.eval_sequences", j.eval_sequences);
  r.get_list("lora.targets", j.lora_targets);
  r.get("lora.rank", j.lora_rank);
  r.get("lora.alpha", j.lora_alpha);
  r.get_list("lora.train", j.train_patterns);
  for (const std::string& g : kLoraGroups) {
    if (!r.has("lora." + g)) continue;
    LoraGroup lg{j.lora_rank, j.lora_alpha};
    r.get("lora." + g + ".rank", lg.rank);
    r.get("lora." + g + ".alpha", lg.alpha);
    j.lora_groups[g] = lg;
  }
  r.get("optim.lr", j.lr);
  r.get("optim.min_lr_ratio", j.min_lr_ratio);
  r.get("optim.beta1", j.beta1);
  r.get("optim.beta2", j.beta2);
  r.get("optim.eps", j.eps);
  r.get("optim.weight_decay", j.weight_decay);
  r.get("optim.clip", j.clip);
  r.get("schedule.steps", j.steps);
  r.get("schedule.warmup", j.warmup);
  r.get("train.batch", j.batch);
  r.get("train.grad_accum", j.grad_accum);
  r.get("train.nonfinite", j.nonfinite);
  r.get("train.recompute", j.recompute);
  r.get("kernels.grouped_gemm", j.grouped_gemm);
  r.get("kernels.kda", j.kda_kernels);
  r.get("checkpoint.every", j.checkpoint_every);
  r.get("checkpoint.keep", j.checkpoint_keep);
  r.get("checkpoint.on_error", j.checkpoint_on_error);
  r.get("parallel.ep", j.ep);
  r.get("parallel.a2a_chunks", j.a2a_chunks);
  r.get("parallel.shard_experts", j.shard_experts);
  r.get("parallel.shard_expert_weights", j.shard_expert_weights);
  r.get("parallel.fsdp", j.fsdp);
  r.get("parallel.plan", j.plan);
  r.get("parallel.mem_gb", j.mem_gb);
  r.get("parallel.comm_timeout_s", j.comm_timeout_s);
  balance::BalanceOptions& bo = j.balance;
  r.get("balance.overflow", bo.overflow);
  r.get("balance.capacity", bo.capacity);
  r.get("balance.rank_capacity", bo.rank_capacity);
  r.get("balance.candidates", bo.candidates);
  r.get("balance.reroute_budget", bo.reroute_budget);
  r.get("balance.predict", bo.predict);
  r.get("balance.ema_alpha", bo.ema_alpha);
  r.get("balance.window", bo.window);
  r.get("balance.compensate", bo.compensate);
  r.get("balance.max_chunks", bo.max_chunks);
  r.get("balance.link_gbs", bo.link_gbs);
  r.get("balance.gflops", bo.gflops);
  r.get("balance.latency_us", bo.latency_us);
  r.get("balance.placement", bo.placement);
  r.get("balance.placement_every", bo.placement_every);
  r.get("balance.trace", bo.trace);
  r.get_int_list("balance.skew_experts", bo.skew_experts);
  r.get("balance.skew_bias", bo.skew_bias);
  r.get("log.every", j.log_every);
  r.get("log.eval_every", j.eval_every);
  r.get("log.progress", j.progress);
  r.check_all_used();

  auto need = [&](bool ok, const char* key, auto value, const char* rule) {
    MT_CHECK(ok, ConfigError, source, ": key '", key, "' = ", value, " ", rule);
  };
  need(!j.train_data.empty(), "data.train", "\"\"", "must name a prepared dataset");
  need(j.steps > 0, "schedule.steps", j.steps, "must be positive");
  need(j.warmup >= 0 && j.warmup <= j.steps, "schedule.warmup", j.warmup, "must be in [0, steps]");
  need(j.batch > 0, "train.batch", j.batch, "must be positive");
  need(j.grad_accum > 0, "train.grad_accum", j.grad_accum, "must be positive");
  parse_activation_recompute(j.recompute, source + ": key 'train.recompute'");
  if (!j.grouped_gemm.empty()) {
    try {
      ops::parse_grouped_gemm_config(j.grouped_gemm);
    } catch (const Error& e) {
      MT_THROW(ConfigError, source, ": key 'kernels.grouped_gemm' = \"", j.grouped_gemm,
               "\": ", e.message());
    }
  }
  try {
    ops::parse_kda_kernels(j.kda_kernels);
  } catch (const Error& e) {
    MT_THROW(ConfigError, source, ": key 'kernels.kda' = \"", j.kda_kernels, "\": ", e.message());
  }
  need(j.lr > 0, "optim.lr", j.lr, "must be positive");
  need(j.min_lr_ratio >= 0 && j.min_lr_ratio <= 1, "optim.min_lr_ratio", j.min_lr_ratio,
       "must be in [0, 1]");
  need(j.lora_rank > 0, "lora.rank", j.lora_rank, "must be positive");
  need(j.checkpoint_every >= 0, "checkpoint.every", j.checkpoint_every, "must be >= 0");
  need(j.checkpoint_keep > 0, "checkpoint.keep", j.checkpoint_keep, "must be positive");
  need(j.log_every > 0, "log.every", j.log_every, "must be positive");
  need(j.nonfinite == "stop" || j.nonfinite == "skip", "train.nonfinite",
       cat("\"", j.nonfinite, "\""), "must be \"stop\" or \"skip\"");
  need(j.checkpoint_on_error == "stop" || j.checkpoint_on_error == "continue",
       "checkpoint.on_error", cat("\"", j.checkpoint_on_error, "\""),
       "must be \"stop\" or \"continue\"");
  need(j.comm_timeout_s > 0, "parallel.comm_timeout_s", j.comm_timeout_s, "must be positive");
  need(j.ep > 0, "parallel.ep", j.ep, "must be positive");
  need(j.a2a_chunks > 0, "parallel.a2a_chunks", j.a2a_chunks, "must be positive");
  need(j.plan == "manual" || j.plan == "auto", "parallel.plan", j.plan, "must be manual or auto");
  need(j.mem_gb >= 0, "parallel.mem_gb", j.mem_gb, "must be >= 0 (0: host memory / ranks)");
  need(j.device == "cpu" || j.device == "cuda" || j.device == "auto", "run.device",
       cat("\"", j.device, "\""), "must be \"cpu\", \"cuda\" or \"auto\"");
  need(j.precision == "fp32" || j.precision == "bf16", "model.precision",
       cat("\"", j.precision, "\""), "must be \"fp32\" or \"bf16\"");
  need(j.progress == "auto" || j.progress == "tty" || j.progress == "plain" || j.progress == "off",
       "log.progress", j.progress, "must be auto, tty, plain or off");
  need(bo.capacity > 0, "balance.capacity", bo.capacity, "must be positive");
  need(bo.rank_capacity >= 0, "balance.rank_capacity", bo.rank_capacity, "must be >= 0 (0: none)");
  need(bo.candidates >= (bo.overflow ? 1 : 0), "balance.candidates", bo.candidates,
       "must be >= 1 with overflow on (the candidates that may take overflow)");
  need(bo.reroute_budget >= 0 && bo.reroute_budget <= 1, "balance.reroute_budget",
       bo.reroute_budget, "must be in [0, 1]");
  need(bo.ema_alpha > 0 && bo.ema_alpha <= 1, "balance.ema_alpha", bo.ema_alpha,
       "must be in (0, 1]");
  need(bo.window > 0, "balance.window", bo.window, "must be positive");
  need(bo.max_chunks > 0, "balance.max_chunks", bo.max_chunks, "must be positive");
  need(bo.link_gbs > 0, "balance.link_gbs", bo.link_gbs, "must be positive");
  need(bo.gflops > 0, "balance.gflops", bo.gflops, "must be positive");
  need(bo.latency_us >= 0, "balance.latency_us", bo.latency_us, "must be >= 0");
  need(bo.placement_every >= 0, "balance.placement_every", bo.placement_every, "must be >= 0");
  need(!bo.placement || bo.placement_every > 0, "balance.placement_every", bo.placement_every,
       "must be > 0 with balance.placement");
  check_lora_targets(j.lora_targets, source);
  MT_CHECK(j.vision_tower == "auto" || j.vision_tower == "train" || j.vision_tower == "freeze",
           ConfigError, source, ": model.vision_tower = \"", j.vision_tower,
           "\": must be \"auto\", \"train\" or \"freeze\"");
  for (const auto& [g, lg] : j.lora_groups)
    need(lg.rank > 0, ("lora." + g + ".rank").c_str(), lg.rank, "must be positive");
  return j;
}

std::string Job::to_toml() const {
  toml::table eval;
  for (const auto& [k, v] : eval_data) eval.insert(k, v);
  toml::array targets, train;
  for (const auto& t : lora_targets) targets.push_back(t);
  for (const auto& t : train_patterns) train.push_back(t);
  toml::table lora{{"targets", targets},
                   {"rank", lora_rank},
                   {"alpha", static_cast<double>(lora_alpha)},
                   {"train", train}};
  for (const auto& [g, lg] : lora_groups)
    lora.insert(g, toml::table{{"rank", lg.rank}, {"alpha", static_cast<double>(lg.alpha)}});
  toml::table root{
      {"run", toml::table{{"dir", run_dir},
                          {"seed", static_cast<int64_t>(seed)},
                          {"threads", threads},
                          {"device", device},
                          {"deterministic", deterministic}}},
      {"model", toml::table{{"config", model},
                            {"dir", model_dir},
                            {"init", init},
                            {"precision", precision},
                            {"vision_tower", vision_tower}}},
      {"data",
       toml::table{{"train", train_data}, {"eval", eval}, {"eval_sequences", eval_sequences}}},
      {"lora", lora},
      {"optim", toml::table{{"lr", static_cast<double>(lr)},
                            {"min_lr_ratio", static_cast<double>(min_lr_ratio)},
                            {"beta1", static_cast<double>(beta1)},
                            {"beta2", static_cast<double>(beta2)},
                            {"eps", static_cast<double>(eps)},
                            {"weight_decay", static_cast<double>(weight_decay)},
                            {"clip", clip}}},
      {"schedule", toml::table{{"steps", steps}, {"warmup", warmup}}},
      {"train", toml::table{{"batch", batch},
                            {"grad_accum", grad_accum},
                            {"nonfinite", nonfinite},
                            {"recompute", recompute}}},
      {"kernels", toml::table{{"grouped_gemm", grouped_gemm}, {"kda", kda_kernels}}},
      {"checkpoint", toml::table{{"every", checkpoint_every},
                                 {"keep", checkpoint_keep},
                                 {"on_error", checkpoint_on_error}}},
      {"parallel", toml::table{{"ep", ep},
                               {"a2a_chunks", a2a_chunks},
                               {"shard_experts", shard_experts},
                               {"shard_expert_weights", shard_expert_weights},
                               {"fsdp", fsdp},
                               {"plan", plan},
                               {"mem_gb", mem_gb},
                               {"comm_timeout_s", comm_timeout_s}}},
      {"balance",
       [&] {
         const balance::BalanceOptions& b = balance;
         toml::array skew;
         for (int64_t e : b.skew_experts) skew.push_back(e);
         return toml::table{{"overflow", b.overflow},
                            {"capacity", b.capacity},
                            {"rank_capacity", b.rank_capacity},
                            {"candidates", b.candidates},
                            {"reroute_budget", b.reroute_budget},
                            {"predict", b.predict},
                            {"ema_alpha", b.ema_alpha},
                            {"window", b.window},
                            {"compensate", b.compensate},
                            {"max_chunks", b.max_chunks},
                            {"link_gbs", b.link_gbs},
                            {"gflops", b.gflops},
                            {"latency_us", b.latency_us},
                            {"placement", b.placement},
                            {"placement_every", b.placement_every},
                            {"trace", b.trace},
                            {"skew_experts", skew},
                            {"skew_bias", b.skew_bias}};
       }()},
      {"log",
       toml::table{{"every", log_every}, {"eval_every", eval_every}, {"progress", progress}}}};
  std::ostringstream os;
  os << root << "\n";
  return os.str();
}

void check_lora_targets(const std::vector<std::string>& targets, const std::string& source) {
  for (const std::string& t : targets) {
    bool known = false;
    for (const std::string& g : kLoraGroups) known |= g == t;
    MT_CHECK(known, ConfigError, source, ": lora.targets: unknown target '", t,
             "' (attention, kda, shared_experts, routed_experts, dense_ffn, router, "
             "vision_projector, vision_tower)");
  }
}

ModelConfig job_model_config(const Job& job) {
  ModelConfig cfg = load_model_config(job.model).model;
  cfg.kda.kernels = ops::parse_kda_kernels(job.kda_kernels);
  for (const std::string& t : job.lora_targets) {
    auto it = job.lora_groups.find(t);
    LoraGroup g =
        it != job.lora_groups.end() ? it->second : LoraGroup{job.lora_rank, job.lora_alpha};
    const LoraSpec spec{.rank = g.rank, .alpha = g.alpha};
    if (t == "attention") {
      cfg.mla.lora = spec;
      cfg.dsa.mla.lora = spec;
    } else if (t == "kda") {
      cfg.kda.lora = spec;
    } else if (t == "shared_experts") {
      cfg.moe.lora = spec;
    } else if (t == "routed_experts") {
      cfg.moe.expert_lora = spec;
    } else if (t == "dense_ffn") {
      cfg.dense.lora = spec;
    } else if (t == "vision_projector" || t == "vision_tower") {
      MT_CHECK(cfg.vision != nullptr, ConfigError, "lora.targets: '", t,
               "' needs a model with a vision tower (kimi_k25), '", job.model, "' has none");
      auto v = std::make_shared<VisionConfig>(*cfg.vision);
      (t == "vision_tower" ? v->lora : v->projector_lora) = spec;
      cfg.vision = std::move(v);
    }
  }
  MT_CHECK(job.vision_tower == "auto" || cfg.vision != nullptr, ConfigError,
           "model.vision_tower = \"", job.vision_tower, "\", but '", job.model,
           "' has no vision tower");
  // A target or glob that selects nothing would quietly train less than the job asks for (or, with
  // the base frozen, nothing at all).
  const std::vector<NamedSpec> specs = model_param_specs(cfg);
  for (const std::string& t : job.lora_targets) {
    bool hit = false;
    if (t == "vision_projector" || t == "vision_tower") hit = cfg.vision != nullptr;
    for (const NamedSpec& s : specs)
      hit |= t == "router" ? glob_match(kRouterWeights, s.name)
                           : s.spec.role == ParamRole::Lora && lora_group_of(cfg, s.name) == t;
    MT_CHECK(hit, ConfigError, "lora.targets: '", t, "' matches no module of model '", job.model,
             "' (it has no layer of that kind)");
  }
  for (const std::string& p : job.train_patterns) {
    bool hit = false;
    for (const NamedSpec& s : specs) hit |= glob_match(p, s.name);
    MT_CHECK(hit, ConfigError, "lora.train: pattern '", p, "' matches no parameter of model '",
             job.model, "'");
  }
  return cfg;
}

std::string lora_group_of(const ModelConfig& cfg, const std::string& name) {
  if (name.rfind(VisionFrontEnd::kProjectorPrefix, 0) == 0) return "vision_projector";
  if (name.rfind(VisionFrontEnd::kTowerPrefix, 0) == 0) return "vision_tower";
  const std::string pre = "model.layers.";
  if (name.rfind(pre, 0) != 0) return "";
  const size_t dot = name.find('.', pre.size());
  const auto layer = static_cast<size_t>(std::stoll(name.substr(pre.size(), dot - pre.size())));
  const std::string rest = name.substr(dot + 1);
  if (rest.rfind("self_attn.", 0) == 0)
    return cfg.layers.at(layer).mixer == MixerKind::Kda ? "kda" : "attention";
  if (rest.rfind("mlp.", 0) != 0) return "";
  if (cfg.layers.at(layer).ffn == FfnKind::Dense) return "dense_ffn";
  if (rest.rfind("mlp.experts.", 0) == 0) return "routed_experts";
  if (rest.rfind("mlp.gate.", 0) == 0) return "router";
  return "shared_experts";
}

float lora_alpha_of(const Job& job, const std::string& group) {
  auto it = job.lora_groups.find(group);
  return it != job.lora_groups.end() ? it->second.alpha : job.lora_alpha;
}

ActivationRecompute parse_activation_recompute(const std::string& s, const std::string& key) {
  if (s == "none") return ActivationRecompute::None;
  if (s == "selective") return ActivationRecompute::Selective;
  MT_CHECK(s == "full", ConfigError, key, " = \"", s, "\" must be none, selective or full");
  return ActivationRecompute::Full;
}

ModelOptions job_model_options(const Job& job) {
  ModelOptions o;
  o.precision = parse_precision(job.precision, "model.precision");
  o.recompute = parse_activation_recompute(job.recompute, "train.recompute");
  if (!job.grouped_gemm.empty()) o.grouped_gemm = ops::parse_grouped_gemm_config(job.grouped_gemm);
  const std::string tower = std::string(VisionFrontEnd::kTowerPrefix) + "*";
  if (job.lora_targets.empty() && job.train_patterns.empty()) {
    // Full training trains the tower too, unless it is frozen.
    if (job.vision_tower != "freeze") return o;
    o.freeze_base = true;
    o.also_train = [tower](const std::string& name) { return !glob_match(tower, name); };
    return o;
  }
  o.freeze_base = true;
  std::vector<std::string> patterns = job.train_patterns;
  for (const std::string& t : job.lora_targets)
    if (t == "router") patterns.push_back(kRouterWeights);
  if (job.vision_tower == "train") patterns.push_back(tower);
  const bool freeze_tower = job.vision_tower == "freeze";
  o.also_train = [patterns, tower, freeze_tower](const std::string& name) {
    if (freeze_tower && glob_match(tower, name)) return false;
    for (const std::string& p : patterns)
      if (glob_match(p, name)) return true;
    return false;
  };
  return o;
}

Device job_device(const Job& job) {
  if (job.device == "cpu") return Device::CPU;
  if (cuda_available()) return Device::CUDA;
  MT_CHECK(job.device == "auto", ConfigError, "run.device = \"cuda\", but ",
           cuda_device_count() == 0 && !cuda_available()
               ? "no GPU is visible or this binary was built without CUDA (-DMOETRAIN_CUDA=ON)"
               : "no GPU is usable",
           "; use run.device = \"cpu\" or \"auto\"");
  return Device::CPU;
}

}  // namespace mt
