#include "train/tune.h"

#include <unistd.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <sstream>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "ops/grouped_matmul.h"
#include "parallel/comm.h"
#include "plan/tune.h"
#include "train/job.h"
#include "train/trainer.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

// `key`'s value in the resolved job, as TOML writes it ("" where the job has no such key).
std::string job_value(const Job& job, const std::string& key) {
  const toml::table t = toml::parse(job.to_toml());
  const toml::node* n = t.at_path(key).node();
  if (!n) return "";
  std::ostringstream os;
  n->visit([&](const auto& v) { os << v; });
  return os.str();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// The job's own settings as a point of the space, or -1 where a value of the job is not in it.
// Values compare as the job resolves them ("4" and "4.0" for a float key, quoted or not). Loading
// every value also checks that the job accepts it (a ConfigError naming the key), before any trial.
int64_t own_index(const plan::TuneSpace& space, const std::string& path,
                  const std::vector<std::string>& overrides, const Job& base) {
  std::vector<int> at;
  bool inside = true;
  for (const plan::TuneDim& d : space.dims) {
    const std::string mine = job_value(base, d.key);
    MT_CHECK(!mine.empty(), ConfigError, "tune space: '", d.key,
             "' is not a job key (docs/training.md lists them)");
    int found = -1;
    for (size_t i = 0; i < d.values.size(); ++i) {
      std::vector<std::string> o = overrides;
      o.push_back(d.key + "=" + d.values[i]);
      if (job_value(Job::load(path, o), d.key) == mine && found < 0) found = static_cast<int>(i);
    }
    inside = inside && found >= 0;
    at.push_back(found);
  }
  return inside ? space.index_of(at) : -1;
}

}  // namespace

std::string auto_tune_space(const Job& job, int ranks) {
  std::string s = "train.recompute=none,selective,full";
  const Device device = job_device(job);
  if (device == Device::CPU) {
    const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks);
    std::string threads;
    for (int t = 1; t < cores; t *= 2) threads += std::to_string(t) + ",";
    s += ";run.threads=" + threads + std::to_string(cores);
  }
  const ModelConfig cfg = job_model_config(job);
  bool experts = false, kda = false;
  for (const LayerIR& l : cfg.layers) {
    experts = experts || l.ffn == FfnKind::Moe;
    kda = kda || l.mixer == MixerKind::Kda;
  }
  if (device == Device::CUDA && kda) {
    s += ";kernels.kda=";
    for (size_t i = 0; i < std::size(kAutoKdaKernels); ++i) {
      if (i) s += ",";
      s += kAutoKdaKernels[i];
    }
  }
  if (device == Device::CUDA && experts) {
    s += ";kernels.grouped_gemm=";
    for (size_t i = 0; i < std::size(ops::kGroupedGemmKernels); ++i) {
      if (i) s += ",";
      s += ops::kGroupedGemmKernels[i];
    }
  }
  if (ranks > 1) {
    s += ";parallel.a2a_chunks=1,2,4";
    std::string eps;
    for (int e = 1; e <= ranks; ++e)
      if (ranks % e == 0 && (!experts || cfg.moe.num_experts % e == 0)) {
        if (!eps.empty()) eps += ",";
        eps += std::to_string(e);
      }
    s += ";parallel.ep=" + eps;
  }
  return s;
}

nlohmann::json TuneResult::to_json() const {
  nlohmann::json j = {{"stopped", stopped}, {"trials", nlohmann::json::array()}};
  for (const TuneTrial& t : trials) {
    nlohmann::json o = {{"index", t.index}, {"overrides", t.overrides}};
    if (t.error.empty()) {
      o["step_seconds"] = t.step_seconds;
      o["tokens_per_s"] = t.tokens_per_s;
    } else {
      o["error"] = t.error;
    }
    j["trials"].push_back(o);
  }
  if (best >= 0) {
    const TuneTrial& b = trials[static_cast<size_t>(best)];
    j["best"] = j["trials"][static_cast<size_t>(best)];
    if (trials[0].error.empty()) j["speedup_over_own"] = trials[0].step_seconds / b.step_seconds;
  }
  if (confirmed_speedup > 0)
    j["confirmed"] = {{"own_step_seconds", confirm_own},
                      {"best_step_seconds", confirm_best},
                      {"speedup_over_own", confirmed_speedup}};
  return j;
}

TuneResult tune_job(const std::string& job_path, const std::vector<std::string>& overrides,
                    const TuneOptions& opt, std::ostream& log, par::Comm* world) {
  const int ranks = world ? world->size() : 1;
  MT_CHECK(opt.trials >= 1 && opt.steps >= 1 && opt.warmup >= 0 && opt.initial >= 0, ConfigError,
           "tune: --trials ", opt.trials, ", --steps ", opt.steps, ", --warmup ", opt.warmup,
           ", --initial ", opt.initial, ": trials and steps must be >= 1, the others >= 0");
  const Job base = Job::load(job_path, overrides);
  const std::string spec = opt.space == "auto" ? auto_tune_space(base, ranks) : opt.space;
  const plan::TuneSpace space = plan::parse_tune_space(spec);
  // Every value of every key must be one the job accepts: found now, not at trial 7.
  const int64_t own = own_index(space, job_path, overrides, base);

  const bool temp = opt.work_dir.empty();
  // One name on every rank: rank 0's process id.
  int64_t pid = ::getpid();
  if (world) world->broadcast(&pid, 1, par::Elem::I64, 0);
  const fs::path work = temp ? fs::temp_directory_path() / ("moetrain-tune-" + std::to_string(pid))
                             : fs::path(opt.work_dir);
  fs::create_directories(work);
  log << "tune: " << space.size() << " settings of " << space.dims.size() << " job key"
      << (space.dims.size() == 1 ? "" : "s") << " (" << spec << "), at most " << opt.trials
      << " trials of " << opt.warmup << " + " << opt.steps << " steps; the job's own settings "
      << (own >= 0 ? "are one of them" : "lie outside them and are measured first") << "\n";

  std::vector<std::vector<double>> points;
  for (int64_t i = 0; i < space.size(); ++i) points.push_back(space.coordinates(i));
  plan::BayesOpt bo(points, opt.seed, static_cast<int>(opt.initial));
  TuneResult r;
  int runs = 0;  // trial directories
  const auto label = [&](int64_t index) {
    return index >= 0 ? joined(space.overrides(index), " ")
                      : std::string("(the job's own settings)");
  };
  // One run of the job under `index`'s settings (-1: its own): on a mesh every rank's, and the
  // figure is the slowest rank's.
  const auto run_trial = [&](int64_t index) {
    TuneTrial t{.index = index};
    std::vector<std::string> o = overrides;
    if (index >= 0) t.overrides = space.overrides(index);
    o.insert(o.end(), t.overrides.begin(), t.overrides.end());
    char name[32];
    std::snprintf(name, sizeof name, "trial_%03d", runs++);
    try {
      Job job = Job::load(job_path, o);
      // Speed only: random weights, no evaluation, no checkpoints, no progress lines.
      if (!job.model_dir.empty()) job.model = job.model_dir;
      job.model_dir.clear();
      job.init.clear();
      job.eval_data.clear();
      job.eval_every = 0;
      job.steps = opt.warmup + opt.steps;
      job.warmup = 0;
      job.progress = "off";
      job.run_dir = (work / name).string();
      std::error_code ec;  // a directory left by an earlier tuning in --work-dir: rank 0 clears it
      if (!world || world->rank() == 0) fs::remove_all(job.run_dir, ec);
      if (world) world->barrier();
      std::ostringstream quiet;
      const TrainResult tr = run_job(job, {.world = world, .save_checkpoints = false}, quiet);
      const std::vector<double> measured(tr.step_seconds.begin() + opt.warmup,
                                         tr.step_seconds.end());
      t.step_seconds = median(measured);
      const double tokens_per_step =
          tr.tokens_per_s * tr.seconds / static_cast<double>(tr.step_seconds.size());
      t.tokens_per_s = tokens_per_step / t.step_seconds;
    } catch (const par::CommError&) {
      throw;  // a peer failed mid-collective: the mesh cannot run another trial
    } catch (const Error& e) {
      t.error = e.what();
    }
    if (world && ranks > 1) {
      // The mesh's figure is its slowest rank's; a rank that failed fails the trial everywhere.
      const double mine[2] = {t.error.empty() ? 1.0 : 0.0, t.step_seconds};
      std::vector<double> all(static_cast<size_t>(2 * ranks));
      world->all_gather(mine, 2, all.data(), par::Elem::F64);
      for (int k = 0; k < ranks; ++k) {
        if (all[static_cast<size_t>(2 * k)] == 0 && t.error.empty())
          t.error = cat("failed on rank ", k, " (its own error is not gathered)");
        t.step_seconds = std::max(t.step_seconds, all[static_cast<size_t>(2 * k + 1)]);
      }
      if (!t.error.empty()) t.step_seconds = t.tokens_per_s = 0;
    }
    return t;
  };
  const auto figures = [](const TuneTrial& t) {
    if (!t.error.empty()) return "failed: " + t.error;
    char line[96];
    std::snprintf(line, sizeof line, "%.4f s/step, %.0f tokens/s", t.step_seconds, t.tokens_per_s);
    return std::string(line);
  };
  // A trial of the search: its setting logged first (a large model's trial takes minutes).
  const auto measure = [&](int64_t index) {
    log << "trial " << r.trials.size() + 1 << "/" << opt.trials << "  " << label(index) << "  "
        << std::flush;
    const TuneTrial t = run_trial(index);
    r.trials.push_back(t);
    if (index >= 0)
      bo.observe(static_cast<int>(index),
                 t.error.empty() ? std::log(t.step_seconds) : std::nan(""));
    if (t.error.empty() &&
        (r.best < 0 || t.step_seconds < r.trials[static_cast<size_t>(r.best)].step_seconds))
      r.best = static_cast<int>(r.trials.size() - 1);
    log << figures(t) << "\n";
  };

  const auto all_tried = [&] {
    for (int64_t i = 0; i < space.size(); ++i)
      if (!bo.tried(static_cast<int>(i))) return false;
    return true;
  };
  measure(own);
  while (r.stopped.empty()) {
    if (all_tried()) {
      r.stopped = "exhausted";
    } else if (static_cast<int64_t>(r.trials.size()) >= opt.trials) {
      r.stopped = "budget";
    } else if (const int next = bo.next(opt.min_gain); next >= 0) {
      measure(next);
    } else {
      r.stopped = "converged";
    }
  }
  // The search kept the fastest of single measurements, which noise can favour: the job's own
  // settings and the best run once more each, and the speedup is the ratio of the two means.
  if (opt.confirm && r.best > 0 && r.trials[0].error.empty()) {
    const TuneTrial& own0 = r.trials[0];
    const TuneTrial& best0 = r.trials[static_cast<size_t>(r.best)];
    log << "confirming: the job's own settings and the best once more\n";
    const TuneTrial own1 = run_trial(own0.index), best1 = run_trial(best0.index);
    log << "  " << label(own0.index) << "  " << figures(own1) << "\n  " << label(best0.index)
        << "  " << figures(best1) << "\n";
    if (own1.error.empty() && best1.error.empty()) {
      r.confirm_own = {own0.step_seconds, own1.step_seconds};
      r.confirm_best = {best0.step_seconds, best1.step_seconds};
      r.confirmed_speedup =
          (own0.step_seconds + own1.step_seconds) / (best0.step_seconds + best1.step_seconds);
    }
  }
  if (temp) {
    if (world) world->barrier();
    std::error_code ec;  // ranks on one host remove the same directory
    fs::remove_all(work, ec);
  }

  if (r.best < 0) {
    log << "tune: no setting ran (every trial failed; the first error: " << r.trials[0].error
        << ")\n";
    return r;
  }
  const TuneTrial& b = r.trials[static_cast<size_t>(r.best)];
  char text[128];
  std::snprintf(text, sizeof text, "%.4f s/step", b.step_seconds);
  log << "best: "
      << (b.index >= 0 ? joined(b.overrides, " ") : std::string("the job's own settings")) << ", "
      << text;
  if (r.trials[0].error.empty()) {
    std::snprintf(text, sizeof text, "%.2fx the job's own (%.4f s/step)",
                  r.trials[0].step_seconds / b.step_seconds, r.trials[0].step_seconds);
    log << ", " << text;
  }
  if (r.confirmed_speedup > 0) {
    std::snprintf(text, sizeof text, "%.2fx", r.confirmed_speedup);
    log << " (" << text << " over two runs each)";
  }
  log << "; stopped: "
      << (r.stopped == "converged" ? cat("converged (no untried setting expected to be ",
                                         100 * opt.min_gain, "% faster)")
          : r.stopped == "budget"  ? std::string("the trial budget is spent")
                                   : std::string("every setting measured"))
      << "\n";
  if (b.index >= 0) log << "use: --set " << joined(b.overrides, " --set ") << "\n";
  return r;
}

}  // namespace mt
