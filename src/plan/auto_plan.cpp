#include "plan/auto_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace mt::plan {

namespace {

std::string bytes_str(double b) {
  char s[32];
  if (b >= 1e9)
    std::snprintf(s, sizeof s, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(s, sizeof s, "%.2f MB", b / 1e6);
  else
    std::snprintf(s, sizeof s, "%.1f kB", b / 1e3);
  return s;
}

std::string breakdown(const MemoryBreakdown& m) {
  std::ostringstream s;
  s << "weights " << bytes_str(m.weights) << ", gradients " << bytes_str(m.grads) << ", optimizer "
    << bytes_str(m.optimizer + m.master) << ", activations " << bytes_str(m.activations)
    << ", step buffers " << bytes_str(m.fsdp_buffers) << ", expert exchange "
    << bytes_str(m.a2a_buffers) << ", workspace " << bytes_str(m.workspace) << " = "
    << bytes_str(m.total());
  return s.str();
}

std::string mesh_str(const ParallelPlan& p) {
  std::ostringstream s;
  const bool zero3 = p.engine == Engine::FsdpEp && p.expert_shard > 1;
  s << "ep " << p.ep << ", a2a_chunks " << p.a2a_chunks << ", shard_experts "
    << (p.expert_shard > 1 ? "on" : "off") << ", shard_expert_weights " << (zero3 ? "on" : "off")
    << ", recompute " << recompute_name(p.recompute) << ", " << p.mbs << " sequence(s) x " << p.seq
    << " tokens per rank per micro-batch";
  return s.str();
}

std::vector<int64_t> divisors_desc(int64_t n, int64_t at_most) {
  std::vector<int64_t> d;
  for (int64_t i = std::min(n, at_most); i >= 1; --i)
    if (n % i == 0) d.push_back(i);
  return d;
}

}  // namespace

std::string PlanJob::set_args() const {
  std::ostringstream s;
  s << "--set parallel.ep=" << ep << " --set parallel.a2a_chunks=" << a2a_chunks
    << " --set parallel.fsdp=" << (fsdp ? "true" : "false")
    << " --set parallel.shard_experts=" << (shard_experts ? "true" : "false")
    << " --set parallel.shard_expert_weights=" << (shard_expert_weights ? "true" : "false")
    << " --set train.recompute=" << recompute_name(recompute) << " --set train.batch=" << batch;
  return s.str();
}

PlanJob plan_job(const ParallelPlan& p) {
  PlanJob j{.ep = p.ep,
            .a2a_chunks = p.a2a_chunks,
            .world = p.world,
            .batch = p.mbs * p.world,
            .recompute = p.recompute};
  const bool sharded = p.expert_shard > 1;
  std::ostringstream why;
  if (p.engine == Engine::Zero1Ep) {
    j.shard_experts = sharded;
  } else {
    // Fsdp (the GPU plans) and fsdp+ep: dense shards over the world, experts ZeRO-3.
    j.fsdp = p.world > 1;
    j.shard_experts = j.shard_expert_weights = sharded;
    if (p.fsdp != p.world && p.world > 1)
      why << "dense parameters sharded over " << p.fsdp << " of " << p.world
          << " ranks (the engine shards them over all ranks)";
  }
  if (sharded && p.expert_shard != p.replicas)
    why << (why.tellp() > 0 ? "; " : "") << "experts sharded over " << p.expert_shard << " of "
        << p.replicas << " replicas (the engine shards them over all replicas)";
  j.unsupported = why.str();
  return j;
}

Hardware cpu_host(double mem_bytes) {
  Hardware hw;
  hw.mem_bytes = mem_bytes;
  hw.gpus_per_node = 1 << 20;  // one host: every collective stays on shared memory
  hw.peak_flops = 100e9;
  hw.gemm_flops = hw.grouped_flops = 50e9;
  hw.kda_flops = hw.attn_dense_flops = hw.attn_sparse_flops = hw.indexer_flops = 10e9;
  hw.allgather_bw = hw.reduce_scatter_bw = hw.inter_bw = 5e9;
  hw.a2a_curve = {{1e6, 2e9}, {64e6, 5e9}};
  hw.collective_latency = 20e-6;
  return hw;
}

double host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

AutoPlan choose_auto_plan(const AutoRequest& r) {
  MT_CHECK(r.world >= 1 && r.seq >= 1 && r.batch >= 1 && r.grad_accum >= 1, ConfigError,
           "plan auto: world, seq, batch and grad_accum must be positive");
  MT_CHECK(r.mem_bytes > 0, ConfigError,
           "plan auto: no memory limit (set parallel.mem_gb or --mem-gb; the host's memory is "
           "unknown)");
  const int64_t total = r.batch * r.grad_accum;
  MT_CHECK(total % r.world == 0, ConfigError, "plan auto: train.batch x train.grad_accum = ", total,
           " sequences per step do not split over ", r.world,
           " ranks (every rank needs the same number of sequences)");
  const int64_t per_rank = total / r.world;
  const int64_t job_mbs = std::max<int64_t>(1, r.batch / r.world);
  const Hardware hw = cpu_host(r.mem_bytes);

  SearchOptions o;
  o.seq = r.seq;
  o.engine = Engine::Zero1Ep;
  o.memory = {.precision = Precision::fp32(), .freeze_base = r.freeze_base};
  o.keep = 3;

  std::ostringstream why;
  SearchResult last;
  // zero1+ep at any micro-batch before fsdp+ep: FSDP gathers every unit twice a step, while a
  // smaller micro-batch only adds micro-steps of the same work.
  std::vector<Engine> engines{Engine::FsdpEp};
  if (!r.fsdp)
    engines = r.world > 1 ? std::vector<Engine>{Engine::Zero1Ep, Engine::FsdpEp}
                          : std::vector<Engine>{Engine::Zero1Ep};
  // Within an engine, every micro-batch without recompute before recompute (a smaller
  // micro-batch adds micro-steps, recompute adds a forward of work); with recompute allowed the
  // search takes the faster policy that fits (selective before full).
  for (Engine e : engines)
    for (bool replay : {false, true})
      for (int64_t mbs : divisors_desc(per_rank, job_mbs)) {
        o.engine = e;
        o.mbs = mbs;
        o.recompute = replay ? std::nullopt : std::optional<Recompute>(Recompute::None);
        SearchResult res = search(r.cfg, r.world, hw, o);
        if (res.best.empty()) {
          const auto& closest = res.rejections.front().closest;
          why << "  " << mbs << " sequence(s) per rank, engine " << engine_name(e)
              << (replay ? ", any recompute" : ", no recompute") << ": nothing fits; closest "
              << mesh_str(closest.plan) << " needs " << bytes_str(closest.memory.total()) << "\n";
          last = std::move(res);
          continue;
        }
        AutoPlan a;
        a.chosen = res.best.front();
        const ParallelPlan& p = a.chosen.plan;
        a.ep = p.ep;
        a.a2a_chunks = p.a2a_chunks;
        a.shard_experts = p.expert_shard > 1;
        a.fsdp = p.engine == Engine::FsdpEp;
        a.shard_expert_weights = a.fsdp && a.shard_experts;
        a.recompute = p.recompute;
        a.batch = mbs * r.world;
        a.grad_accum = total / a.batch;
        std::ostringstream s;
        s << "plan auto (engine " << engine_name(p.engine) << ", world " << r.world << ", limit "
          << bytes_str(r.mem_bytes) << " per rank from " << r.mem_source << "; " << res.considered
          << " plans considered):\n"
          << "  chosen: " << mesh_str(p) << "; train.batch " << a.batch << ", grad_accum "
          << a.grad_accum << "\n"
          << "  predicted per rank: " << breakdown(a.chosen.memory) << "\n"
          << why.str();
        if (mbs < job_mbs)
          s << "  the job's " << job_mbs << " sequence(s) per rank do not fit; grad_accum "
            << r.grad_accum << " -> " << a.grad_accum << " keeps " << total
            << " sequences per step\n";
        for (const std::string& n : res.notes) s << "  why not " << n << "\n";
        for (const auto& rej : res.rejections)
          s << "  rejected " << rej.count << " plan(s): " << rej.reason << "\n";
        a.explanation = s.str();
        return a;
      }
  std::ostringstream s;
  s << "plan auto: no parallel plan fits " << bytes_str(r.mem_bytes) << " per rank (from "
    << r.mem_source << ") on " << r.world << " rank(s), even at one sequence per rank:\n"
    << why.str();
  for (const auto& rej : last.rejections)
    s << "  " << rej.count << " plan(s) " << rej.reason << "; closest "
      << mesh_str(rej.closest.plan) << ": " << breakdown(rej.closest.memory) << "\n";
  s << "  raise parallel.mem_gb (--mem-gb), run on more ranks, shorten sequences or train LoRA";
  MT_THROW(ConfigError, s.str());
}

}  // namespace mt::plan
