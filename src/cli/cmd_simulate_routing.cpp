#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "parallel/balance/routing_sim.h"

namespace mt::cli {

namespace {

struct SimArgs {
  balance::SimOptions o;
  std::string policies = "both", csv;
  double gbps = 50, tflops = 400, latency_us = 20;
};

double change(double now, double before) {
  return 100 * (now / before - 1);
}

void print_row(const char* name, const balance::SimSummary& s) {
  const balance::SimStep& m = s.mean;
  std::printf(
      "%-7s expert max/mean %6.2f  rank max/mean %5.3f  hot/cold %6.1f  rerouted %5.2f%%  "
      "over-cap %5.2f%%  dead %5.1f  hot %5.1f\n"
      "        a2a MB/rank max %8.2f mean %8.2f  chunks %4.2f  step %8.1f us  idle %8.1f us  "
      "forecast err %5.3f  (%.1f s)\n",
      name, m.expert_max_mean, m.rank_max_mean, m.hot_cold, 100 * m.rerouted_share,
      100 * m.over_capacity_share, s.dead_experts, s.hot_experts, m.a2a_bytes_max / 1e6,
      m.a2a_bytes_mean / 1e6, s.chunks, m.time_max_s * 1e6, m.idle_mean_s * 1e6, m.forecast_err,
      s.seconds);
}

}  // namespace

Command add_simulate_routing_command(CLI::App& app) {
  auto a = std::make_shared<SimArgs>();
  balance::SimOptions& o = a->o;
  CLI::App* c = app.add_subcommand(
      "simulate-routing",
      "replay or synthesise MoE routing and model expert/rank load, all-to-all bytes and idle wait "
      "with the load-balancing policies off and on (docs/load-balancing.md)");
  c->add_option("--experts", o.experts, "routed experts")->capture_default_str();
  c->add_option("--top-k", o.top_k, "experts per token")->capture_default_str();
  c->add_option("--ranks", o.ranks, "ranks (world size)")->capture_default_str();
  c->add_option("--ep", o.ep, "expert-parallel group size")->capture_default_str();
  c->add_option("--tokens-per-rank", o.tokens_per_rank, "tokens per rank per step (modeled)")
      ->capture_default_str();
  c->add_option("--sample-per-rank", o.sample_per_rank,
                "tokens per rank actually drawn; counts are scaled up to --tokens-per-rank")
      ->capture_default_str();
  c->add_option("--steps", o.steps, "steps")->capture_default_str();
  c->add_option("--hot-cold", o.hot_cold,
                "popularity ratio of the hottest to the coldest expert (0: use --zipf)")
      ->capture_default_str();
  c->add_option("--zipf", o.zipf, "Zipf exponent of expert popularity (with --hot-cold 0)")
      ->capture_default_str();
  c->add_option("--drift", o.drift, "expected hot-set swaps per step")->capture_default_str();
  c->add_option("--seed", o.seed, "random seed")->capture_default_str();
  c->add_option("--trace", o.trace, "replay this routing trace instead of a synthetic one");
  c->add_option("--record", o.record, "write the synthetic trace to this file");
  c->add_option("--policies", a->policies, "off, on, or both (compare)")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "on", "both"}));
  c->add_option("--extra", o.extra, "candidates beyond top-k that may take overflow")
      ->capture_default_str();
  c->add_option("--expert-capacity", o.expert_capacity, "expert capacity factor (x mean)")
      ->capture_default_str();
  c->add_option("--rank-capacity", o.rank_capacity, "rank capacity factor (x mean)")
      ->capture_default_str();
  c->add_option("--max-reroute", o.max_reroute_share, "cap on the rerouted share of pairs")
      ->capture_default_str();
  c->add_option("--chunks", o.base_chunks, "all-to-all chunks (policies off; floor when on)")
      ->capture_default_str();
  c->add_option("--max-chunks", o.max_chunks, "most chunks the forecast may choose")
      ->capture_default_str();
  c->add_flag("--placement", o.placement, "with policies on: greedy expert placement too");
  c->add_option("--placement-every", o.placement_every, "steps between placements")
      ->capture_default_str();
  c->add_option("--gbps", a->gbps, "link bandwidth per rank, GB/s")->capture_default_str();
  c->add_option("--tflops", a->tflops, "effective expert TFLOP/s per rank")->capture_default_str();
  c->add_option("--latency-us", a->latency_us, "latency per all-to-all, us")->capture_default_str();
  c->add_option("--csv", a->csv, "per-step figures to this CSV file (policies on when 'both')");
  c->add_option("--threads", o.threads, "threads (0: all)")->capture_default_str();
  return {c, [a] {
            balance::SimOptions base = a->o;
            base.link.bandwidth = a->gbps * 1e9;
            base.link.flops = a->tflops * 1e12;
            base.link.latency = a->latency_us * 1e-6;
            std::unique_ptr<std::ofstream> csv;
            if (!a->csv.empty()) {
              csv = std::make_unique<std::ofstream>(a->csv);
              MT_CHECK(csv->good(), IoError, "cannot write ", a->csv);
              *csv << "step,expert_max_mean,rank_max_mean,hot_cold,rerouted_share,"
                      "over_capacity_share,dead_experts,hot_experts,a2a_bytes_max,"
                      "a2a_bytes_mean,chunks,time_max_s,idle_mean_s,forecast_err\n";
            }
            const balance::SimOptions& so = base;
            std::function<void(const balance::SimStep&)> each = [&](const balance::SimStep& s) {
              if (!csv) return;
              *csv << s.step << ',' << s.expert_max_mean << ',' << s.rank_max_mean << ','
                   << s.hot_cold << ',' << s.rerouted_share << ',' << s.over_capacity_share << ','
                   << s.dead_experts << ',' << s.hot_experts << ',' << s.a2a_bytes_max << ','
                   << s.a2a_bytes_mean << ',' << s.chunks << ',' << s.time_max_s << ','
                   << s.idle_mean_s << ',' << s.forecast_err << '\n';
            };
            std::printf(
                "simulate-routing: %lld experts, top-%lld, %lld ranks, EP %lld, %lld "
                "tokens/rank (%lld drawn), %lld steps\n",
                static_cast<long long>(so.experts), static_cast<long long>(so.top_k),
                static_cast<long long>(so.ranks), static_cast<long long>(so.ep),
                static_cast<long long>(so.tokens_per_rank),
                static_cast<long long>(so.sample_per_rank), static_cast<long long>(so.steps));
            if (a->policies == "both") {
              // Against the strongest static baseline (docs/load-balancing.md, "Against the
              // strongest static baseline").
              const balance::PolicyComparison cmp = balance::compare_policies(so);
              print_row("off", cmp.given);
              print_row(cat("static", cmp.best_chunks).c_str(), cmp.best_static);
              print_row("chunk", cmp.chunking);
              print_row("reroute", cmp.reroute);
              print_row("on", cmp.both);
              const balance::SimStep& b = cmp.best_static.mean;
              std::printf(
                  "against the best static setting (policies off, %d chunks; %d chunks: step "
                  "%+.1f%%):\n"
                  "  step time: chunking %+.1f%%, rerouting %+.1f%%, both %+.1f%%\n"
                  "  idle wait: chunking %+.1f%%, rerouting %+.1f%%, both %+.1f%%\n"
                  "  rank max/mean %.3f -> %.3f, rerouted %.2f%%\n",
                  cmp.best_chunks, so.base_chunks, change(cmp.given.mean.time_max_s, b.time_max_s),
                  change(cmp.chunking.mean.time_max_s, b.time_max_s),
                  change(cmp.reroute.mean.time_max_s, b.time_max_s),
                  change(cmp.both.mean.time_max_s, b.time_max_s),
                  change(cmp.chunking.mean.idle_mean_s, b.idle_mean_s),
                  change(cmp.reroute.mean.idle_mean_s, b.idle_mean_s),
                  change(cmp.both.mean.idle_mean_s, b.idle_mean_s), b.rank_max_mean,
                  cmp.both.mean.rank_max_mean, 100 * cmp.both.mean.rerouted_share);
              if (csv) {  // the per-step figures of the policies-on run
                balance::SimOptions x = so;
                x.overflow = x.compensate = true;
                x.record.clear();
                balance::simulate_routing(x, each);
              }
              return 0;
            }
            balance::SimOptions x = so;
            x.overflow = x.compensate = a->policies == "on";
            x.placement = x.placement && a->policies == "on";
            print_row(a->policies.c_str(), balance::simulate_routing(x, each));
            return 0;
          }};
}

}  // namespace mt::cli
