#include "parallel/balance/routing_sim.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "ops/moe_rules.h"
#include "ops/overflow_route.h"
#include "parallel/balance/load_predictor.h"

namespace mt::balance {

namespace {

// Walker alias table: O(1) draws from the (drifting) popularity distribution.
struct Alias {
  std::vector<double> prob;
  std::vector<int32_t> alias;
  void build(const std::vector<double>& w) {
    const size_t n = w.size();
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    prob.assign(n, 0.0);
    alias.assign(n, 0);
    std::vector<double> q(n);
    std::vector<size_t> small, large;
    for (size_t i = 0; i < n; ++i) {
      q[i] = w[i] * static_cast<double>(n) / sum;
      (q[i] < 1.0 ? small : large).push_back(i);
    }
    while (!small.empty() && !large.empty()) {
      const size_t s = small.back(), l = large.back();
      small.pop_back();
      prob[s] = q[s];
      alias[s] = static_cast<int32_t>(l);
      q[l] -= 1.0 - q[s];
      if (q[l] < 1.0) {
        large.pop_back();
        small.push_back(l);
      }
    }
    for (size_t i : large) prob[i] = 1.0;
    for (size_t i : small) prob[i] = 1.0;
  }
  int32_t draw(Rng& r) const {
    const int64_t i = r.below(static_cast<int64_t>(prob.size()));
    return r.uniform() < prob[i] ? static_cast<int32_t>(i) : alias[i];
  }
};

struct Trace {
  TraceHeader h;
  std::vector<TraceStep> steps;
};

}  // namespace

struct TraceWriter::Impl {
  std::ofstream f;
  std::string path;
};

TraceWriter::TraceWriter(const std::string& path, const TraceHeader& h) : impl_(new Impl), h_(h) {
  impl_->path = path;
  impl_->f.open(path);
  if (!impl_->f) {
    delete impl_;
    MT_THROW(IoError, "cannot write routing trace ", path);
  }
  impl_->f << "moetrain-routing-trace 1\nexperts " << h.experts << " top_k " << h.top_k << " width "
           << h.width << "\n";
}

TraceWriter::~TraceWriter() {
  delete impl_;
}

void TraceWriter::write(const TraceStep& s) {
  MT_CHECK(
      static_cast<int64_t>(s.cand.size()) == s.tokens * h_.width && s.score.size() == s.cand.size(),
      ShapeError, "trace step ", s.step, ": ", s.cand.size(), " ids for ", s.tokens,
      " tokens of width ", h_.width);
  std::ostream& o = impl_->f;
  o << "step " << s.step << " layer " << s.layer << " tokens " << s.tokens << "\n";
  char buf[32];
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t j = 0; j < h_.width; ++j) o << (j ? " " : "") << s.cand[t * h_.width + j];
    for (int64_t j = 0; j < h_.width; ++j) {
      std::snprintf(buf, sizeof buf, " %.7g", static_cast<double>(s.score[t * h_.width + j]));
      o << buf;
    }
    o << "\n";
  }
  MT_CHECK(o.good(), IoError, "writing routing trace ", impl_->path);
}

std::vector<TraceStep> read_trace(const std::string& path, TraceHeader& h) {
  std::ifstream f(path);
  MT_CHECK(f.good(), IoError, "cannot read routing trace ", path);
  std::string line, word;
  int64_t lineno = 0;
  auto next = [&](const char* what) {
    MT_CHECK(static_cast<bool>(std::getline(f, line)), ValueError, path, ":", lineno + 1,
             ": expected ", what, ", found end of file");
    ++lineno;
    return std::istringstream(line);
  };
  {
    auto s = next("the header 'moetrain-routing-trace 1'");
    int v = 0;
    MT_CHECK((s >> word >> v) && word == "moetrain-routing-trace" && v == 1, ValueError, path,
             ":1: not a version-1 moetrain routing trace: '", line, "'");
  }
  {
    auto s = next("'experts E top_k K width W'");
    std::string a, b, c;
    MT_CHECK((s >> a >> h.experts >> b >> h.top_k >> c >> h.width) && a == "experts" &&
                 b == "top_k" && c == "width" && h.experts > 0 && h.top_k > 0 &&
                 h.width >= h.top_k && h.width <= h.experts,
             ValueError, path, ":2: bad dimensions line '", line, "'");
  }
  std::vector<TraceStep> out;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::istringstream s(line);
    TraceStep st;
    std::string a, b, c;
    MT_CHECK((s >> a >> st.step >> b >> st.layer >> c >> st.tokens) && a == "step" &&
                 b == "layer" && c == "tokens" && st.tokens > 0,
             ValueError, path, ":", lineno, ": expected 'step S layer L tokens T', found '", line,
             "'");
    st.cand.resize(static_cast<size_t>(st.tokens * h.width));
    st.score.resize(st.cand.size());
    for (int64_t t = 0; t < st.tokens; ++t) {
      auto ts = next("a token line");
      for (int64_t j = 0; j < h.width; ++j) {
        int64_t e = -1;
        MT_CHECK((ts >> e) && e >= 0 && e < h.experts, ValueError, path, ":", lineno,
                 ": candidate ", j, " is not an expert id in [0, ", h.experts, ")");
        st.cand[t * h.width + j] = static_cast<int32_t>(e);
      }
      for (int64_t j = 0; j < h.width; ++j)
        MT_CHECK(static_cast<bool>(ts >> st.score[t * h.width + j]), ValueError, path, ":", lineno,
                 ": missing score ", j);
    }
    out.push_back(std::move(st));
  }
  MT_CHECK(!out.empty(), ValueError, path, ": trace holds no steps");
  return out;
}

std::vector<int32_t> greedy_placement(const std::vector<double>& load, int64_t ranks) {
  const int64_t E = static_cast<int64_t>(load.size());
  const std::string ep = ops::expert_parallel_error(ranks, E);
  MT_CHECK(ep.empty(), ConfigError, "placement: ", ep);
  const int64_t slots = E / ranks;
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return load[a] > load[b]; });
  std::vector<double> rl(static_cast<size_t>(ranks), 0.0);
  std::vector<int64_t> used(static_cast<size_t>(ranks), 0);
  std::vector<int32_t> where(static_cast<size_t>(E), 0);
  for (int32_t e : order) {
    int64_t best = -1;
    for (int64_t r = 0; r < ranks; ++r)
      if (used[r] < slots && (best < 0 || rl[r] < rl[best])) best = r;
    where[e] = static_cast<int32_t>(best);
    rl[best] += load[e];
    ++used[best];
  }
  return where;
}

SimSummary simulate_routing(const SimOptions& o, const std::function<void(const SimStep&)>& each) {
  const auto t0 = std::chrono::steady_clock::now();
  MT_CHECK(o.ranks > 0, ConfigError, "routing simulation over ", o.ranks, " ranks");
  const std::string bad = ops::expert_parallel_error(o.ep, o.experts, o.ranks);
  MT_CHECK(bad.empty(), ConfigError, "routing simulation: ", bad);
  MT_CHECK(o.top_k > 0 && o.top_k + o.extra <= o.experts && o.extra >= 0, ConfigError, "top_k ",
           o.top_k, " + extra ", o.extra, " candidates of ", o.experts, " experts");
  MT_CHECK(o.steps > 0 && o.tokens_per_rank > 0 && o.sample_per_rank > 0, ConfigError,
           "steps, tokens_per_rank and sample_per_rank must be positive");
  MT_CHECK(o.base_chunks >= 1 && o.max_chunks >= o.base_chunks, ConfigError, "chunks ",
           o.base_chunks, "..", o.max_chunks);
  const int64_t E = o.experts, K = o.top_k, P = o.ep, G = o.ranks / o.ep;
  int64_t W = K + o.extra, S = o.sample_per_rank;

  Trace trace;
  if (!o.trace.empty()) {
    trace.steps = read_trace(o.trace, trace.h);
    MT_CHECK(trace.h.experts == E && trace.h.top_k == K, ConfigError, "trace ", o.trace, " has ",
             trace.h.experts, " experts, top-", trace.h.top_k, "; the simulation asks for ", E,
             ", top-", K);
    W = std::min(W, trace.h.width);
    int64_t tmin = INT64_MAX;
    for (const auto& s : trace.steps) tmin = std::min(tmin, s.tokens);
    MT_CHECK(tmin >= o.ranks, ConfigError, "trace ", o.trace, ": a step of ", tmin,
             " tokens cannot cover ", o.ranks, " ranks");
    S = tmin / o.ranks;
  }
  const int64_t Tr = o.ranks * S;  // simulated tokens per step
  const double scale = static_cast<double>(o.tokens_per_rank) / static_cast<double>(S);
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();

  // Popularity: w_i = i^-zipf over a shuffled order of experts.
  Rng rng(o.seed);
  const double zipf =
      o.hot_cold > 0 ? std::log(o.hot_cold) / std::log(static_cast<double>(E)) : o.zipf;
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = E - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  std::vector<double> wrank(static_cast<size_t>(E));
  for (int64_t i = 0; i < E; ++i) wrank[i] = std::pow(static_cast<double>(i + 1), -zipf);
  Alias alias;
  auto rebuild = [&] {
    std::vector<double> w(static_cast<size_t>(E));
    for (int64_t i = 0; i < E; ++i) w[order[i]] = wrank[i];
    alias.build(w);
  };
  rebuild();

  std::unique_ptr<TraceWriter> rec;
  if (!o.record.empty()) rec = std::make_unique<TraceWriter>(o.record, TraceHeader{E, K, W});

  std::vector<int32_t> layout = ops::contiguous_expert_ranks(E, P);
  LoadPredictor pred(1, layout, {});
  const ops::OverflowParams op{.tokens = P * S,
                               .experts = E,
                               .top_k = K,
                               .extra = W - K,
                               .expert_capacity = o.expert_capacity,
                               .rank_capacity = o.rank_capacity,
                               .max_reroute_share = o.max_reroute_share};
  std::vector<int32_t> cand(static_cast<size_t>(Tr * W)), ids(static_cast<size_t>(Tr * K));
  std::vector<float> prio(cand.size());
  const double row_bytes = static_cast<double>(o.link.latent) * o.link.bytes_per_elem;
  const double row_flops = 6.0 * static_cast<double>(o.link.latent * o.link.ffn);

  SimSummary sum;
  SimStep& m = sum.mean;
  for (int64_t step = 0; step < o.steps; ++step) {
    if (trace.steps.empty()) {
      Rng dr = rng.fork(static_cast<uint64_t>(step));
      const double d = o.drift;
      int64_t swaps = static_cast<int64_t>(d) + (dr.uniform() < d - std::floor(d) ? 1 : 0);
      for (int64_t s = 0; s < swaps; ++s)
        std::swap(order[dr.below(std::max<int64_t>(1, E / 16))], order[dr.below(E)]);
      if (swaps) rebuild();
#pragma omp parallel num_threads(threads)
      {
        std::vector<int64_t> stamp(static_cast<size_t>(E), -1);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < o.ranks; ++r) {
          Rng rr = rng.fork(static_cast<uint64_t>(1 + step * o.ranks + r) << 8);
          for (int64_t t = r * S; t < (r + 1) * S; ++t)
            for (int64_t j = 0; j < W; ++j) {
              int32_t e;
              do e = alias.draw(rr);
              while (stamp[e] == t);
              stamp[e] = t;
              cand[t * W + j] = e;
              prio[t * W + j] = static_cast<float>(
                  (static_cast<double>(W - j) - 0.999 * rr.uniform()) / static_cast<double>(W));
            }
        }
      }
      if (rec) {
        TraceStep ts{.step = step, .layer = 0, .tokens = Tr, .cand = cand, .score = prio};
        rec->write(ts);
      }
    } else {
      const TraceStep& ts = trace.steps[static_cast<size_t>(step) % trace.steps.size()];
      for (int64_t t = 0; t < Tr; ++t)
        for (int64_t j = 0; j < W; ++j) {
          cand[t * W + j] = ts.cand[t * trace.h.width + j];
          prio[t * W + j] = ts.score[t * trace.h.width + j];
        }
    }

    // Route each EP group (replica) on its own tokens.
    SimStep st;
    st.step = step;
    int64_t rerouted = 0, over = 0;
#pragma omp parallel for num_threads(std::min <int64_t>(threads, G)) reduction(+ : rerouted, over)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t b = g * P * S;
      if (o.overflow) {
        const ops::OverflowStats os = ops::overflow_assign(
            op, cand.data() + b * W, prio.data() + b * W, layout, ids.data() + b * K, nullptr);
        rerouted += os.rerouted;
        over += os.over_capacity;
      } else {
        for (int64_t t = b; t < b + P * S; ++t)
          for (int64_t j = 0; j < K; ++j) ids[t * K + j] = cand[t * W + j];
      }
    }
    st.rerouted_share = static_cast<double>(rerouted) / static_cast<double>(Tr * K);
    st.over_capacity_share = static_cast<double>(over) / static_cast<double>(Tr * K);

    // Loads, bytes and the timing model.
    std::vector<int64_t> eload(static_cast<size_t>(E), 0);
    std::vector<double> rank_rows(static_cast<size_t>(o.ranks), 0.0);
    std::vector<double> tmodel(static_cast<size_t>(o.ranks), 0.0);
    int chunks = o.base_chunks;
    if (o.compensate && pred.steps_seen(0) > 0) {
      const std::vector<double> rf = pred.rank_forecast(0);
      const double hot = *std::max_element(rf.begin(), rf.end()) / static_cast<double>(G);
      const double out_rows = static_cast<double>(o.tokens_per_rank * K) *
                              static_cast<double>(P - 1) / static_cast<double>(P);
      const double a2a =
          2.0 * std::max(hot * static_cast<double>(P - 1) / static_cast<double>(P), out_rows) *
          row_bytes / o.link.bandwidth;
      chunks = chunks_for_forecast(a2a, hot * row_flops / o.link.flops, 2 * o.link.latency,
                                   o.max_chunks);
      chunks = std::max(chunks, o.base_chunks);
    }
    st.chunks = chunks;
    double idle_sum = 0, bytes_max = 0, bytes_sum = 0, tmax = 0;
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> out(static_cast<size_t>(P), 0.0), in_remote(static_cast<size_t>(P), 0.0),
          in_all(static_cast<size_t>(P), 0.0);
      for (int64_t t = g * P * S; t < (g + 1) * P * S; ++t) {
        const int64_t src = (t / S) % P;
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = ids[t * K + j];
          ++eload[e];
          const int32_t dst = layout[e];
          in_all[dst] += 1;
          if (dst != src) {
            out[src] += 1;
            in_remote[dst] += 1;
          }
        }
      }
      double gmax = 0;
      std::vector<double> tr(static_cast<size_t>(P));
      for (int64_t p = 0; p < P; ++p) {
        const double rows_out = out[p] * scale, rows_in = in_remote[p] * scale;
        const double bytes = (rows_out + rows_in) * row_bytes;  // dispatch + combine, sent
        bytes_max = std::max(bytes_max, bytes);
        bytes_sum += bytes;
        rank_rows[g * P + p] = in_all[p] * scale;
        const double a2a = 2.0 * std::max(rows_out, rows_in) * row_bytes / o.link.bandwidth;
        const double comp = in_all[p] * scale * row_flops / o.link.flops;
        tr[p] = pipelined_time(a2a, comp, 2 * o.link.latency, chunks);
        gmax = std::max(gmax, tr[p]);
      }
      for (int64_t p = 0; p < P; ++p) idle_sum += gmax - tr[p];
      tmax = std::max(tmax, gmax);
    }
    const double rmean =
        std::accumulate(rank_rows.begin(), rank_rows.end(), 0.0) / static_cast<double>(o.ranks);
    st.rank_max_mean = *std::max_element(rank_rows.begin(), rank_rows.end()) / rmean;
    const double emean = static_cast<double>(Tr * K) / static_cast<double>(E);
    const int64_t emax = *std::max_element(eload.begin(), eload.end());
    const int64_t emin = *std::min_element(eload.begin(), eload.end());
    st.expert_max_mean = static_cast<double>(emax) / emean;
    st.hot_cold = static_cast<double>(emax) / static_cast<double>(std::max<int64_t>(emin, 1));
    st.dead_experts = std::count(eload.begin(), eload.end(), int64_t{0});
    st.a2a_bytes_max = bytes_max;
    st.a2a_bytes_mean = bytes_sum / static_cast<double>(o.ranks);
    st.time_max_s = tmax;
    st.idle_mean_s = idle_sum / static_cast<double>(o.ranks);

    // Predict: score the forecast made before this step, then learn from it.
    std::vector<int64_t> scaled(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      scaled[e] = static_cast<int64_t>(std::llround(static_cast<double>(eload[e]) * scale));
    if (pred.steps_seen(0) > 0) {
      const std::vector<double> f = pred.forecast(0);
      double err = 0;
      for (int64_t e = 0; e < E; ++e) err += std::fabs(f[e] - static_cast<double>(scaled[e]));
      st.forecast_err = err / static_cast<double>(E) / (emean * scale);
    }
    pred.observe(0, scaled);
    const std::vector<char> hot = pred.hot_experts(0);
    st.hot_experts = std::count(hot.begin(), hot.end(), char{1});
    if (o.placement && (step + 1) % o.placement_every == 0) {
      layout = greedy_placement(pred.forecast(0), P);
      pred.set_expert_rank(layout);
    }

    if (each) each(st);
    m.expert_max_mean += st.expert_max_mean;
    m.rank_max_mean += st.rank_max_mean;
    m.hot_cold += st.hot_cold;
    m.rerouted_share += st.rerouted_share;
    m.over_capacity_share += st.over_capacity_share;
    sum.dead_experts += static_cast<double>(st.dead_experts);
    sum.hot_experts += static_cast<double>(st.hot_experts);
    m.a2a_bytes_max += st.a2a_bytes_max;
    m.a2a_bytes_mean += st.a2a_bytes_mean;
    m.time_max_s += st.time_max_s;
    m.idle_mean_s += st.idle_mean_s;
    sum.chunks += st.chunks;
    m.forecast_err += st.forecast_err;
  }
  const double n = static_cast<double>(o.steps);
  m.expert_max_mean /= n;
  m.rank_max_mean /= n;
  m.hot_cold /= n;
  m.rerouted_share /= n;
  m.over_capacity_share /= n;
  m.a2a_bytes_max /= n;
  m.a2a_bytes_mean /= n;
  m.time_max_s /= n;
  m.idle_mean_s /= n;
  m.forecast_err /= std::max(1.0, n - 1);
  sum.chunks /= n;
  sum.dead_experts /= n;
  sum.hot_experts /= n;
  sum.steps = o.steps;
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

PolicyComparison compare_policies(const SimOptions& opt) {
  SimOptions off = opt;
  off.overflow = off.compensate = off.placement = false;
  off.record.clear();
  PolicyComparison c;
  for (int k = opt.base_chunks; k <= opt.max_chunks; ++k) {
    off.base_chunks = k;
    const SimSummary s = simulate_routing(off);
    if (k == opt.base_chunks) c.given = s;
    if (k == opt.base_chunks || s.mean.time_max_s < c.best_static.mean.time_max_s) {
      c.best_static = s;
      c.best_chunks = k;
    }
  }
  SimOptions x = off;
  x.compensate = true;
  c.chunking = simulate_routing(x);
  x = off;
  x.overflow = true;
  x.placement = opt.placement;
  x.base_chunks = c.best_chunks;
  c.reroute = simulate_routing(x);
  x = off;
  x.overflow = x.compensate = true;
  x.placement = opt.placement;
  c.both = simulate_routing(x);
  return c;
}

}  // namespace mt::balance
