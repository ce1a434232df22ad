// The auto-tuner (`moetrain tune`, docs/planner.md "Auto-tuner"): measures real training steps of
// a job under the settings that Bayesian optimisation over a grid of job keys proposes
// (plan/tune.h), the job's own settings first, and reports the fastest with the `--set` flags
// that select it. Each trial is the job itself for warmup + steps optimizer steps with random
// weights (speed does not depend on their values: an HF directory's weights are not loaded),
// without evaluation or checkpoints, in a run directory of its own. Under mpirun every rank runs
// each trial together (the job's mesh), the trial's figure is the slowest rank's, and every rank
// takes the same decisions (the same seed and figures); only rank 0 writes the log.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace mt {

namespace par {
class Comm;
}
struct Job;

struct TuneOptions {
  // plan::parse_tune_space's "key=v1,v2;key=...", or "auto" (auto_tune_space's grid).
  std::string space;
  int64_t trials = 12;      // settings measured at most, the job's own included
  int64_t steps = 4;        // measured optimizer steps per trial
  int64_t warmup = 1;       // steps run first and not measured (allocation, caches, autotuning)
  int64_t initial = 2;      // random settings after the job's own, before the model proposes
  double min_gain = 0.005;  // stop once no setting is expected to be this much faster (relative)
  // After the search, the job's own settings and the best run once more each (two more trials).
  bool confirm = true;
  uint64_t seed = 1;
  std::string work_dir;  // the trials' run directories; empty: a temporary one, removed after
};

struct TuneTrial {
  int64_t index = -1;                  // in the space; -1: the job's own settings outside it
  std::vector<std::string> overrides;  // key=value per dimension ("" for the job's own)
  double step_seconds = 0;             // median of the measured steps
  double tokens_per_s = 0;
  std::string error;  // why the setting could not run (then the figures are 0)
};

struct TuneResult {
  std::vector<TuneTrial> trials;  // in the order measured; trials[0] is the job's own
  int best = -1;                  // into trials: the fastest that ran
  // "converged" (no untried setting expected to gain min_gain), "budget" (trials spent) or
  // "exhausted" (every setting measured).
  std::string stopped;
  // With TuneOptions::confirm, where the best is not the job's own: both settings' two figures
  // (the search's, the confirmation's) and the ratio of their means (0: not confirmed).
  std::vector<double> confirm_own, confirm_best;
  double confirmed_speedup = 0;
  nlohmann::json to_json() const;
};

// The grid `--space auto` tunes for `job` on `ranks` processes: train.recompute (none, selective,
// full); on the CPU run.threads (powers of two up to the host's cores); on a GPU, where the model
// has routed experts, kernels.grouped_gemm (every forward kernel of ops/grouped_matmul.h), and
// where it has KDA layers kernels.kda (kAutoKdaKernels); on a mesh parallel.a2a_chunks (1, 2, 4)
// and parallel.ep (the divisors of the world that divide the experts). Keys that change speed and
// memory, never the model being trained.
std::string auto_tune_space(const Job& job, int ranks);

// The KDA kernel choices (ops::parse_kda_kernels) `--space auto` tries on a GPU: the default, the
// forward overlap in waves (packed batches of several documents), the prepared blocks kept for
// backward (memory for one prep pass), and both; the other choices are the slower predecessors
// that the tests and `moetrain bench kda` keep.
inline constexpr const char* kAutoKdaKernels[] = {"default", "forward_overlap_waves=on",
                                                  "keep_prepared=on",
                                                  "keep_prepared=on:forward_overlap_waves=on"};

// Tunes the job at `job_path` with `overrides` (the command line's --set) applied to every trial.
// Progress, a line per trial, goes to `log`. ConfigError for a bad space or a key the job does not
// have (before any trial runs); a trial that fails (out of memory, a setting the job refuses) is
// recorded with its error and never proposed again. `world`: the job's processes under mpirun
// (null: one process); a collective that times out in a trial ends the tuning (CommError).
TuneResult tune_job(const std::string& job_path, const std::vector<std::string>& overrides,
                    const TuneOptions& opt, std::ostream& log, par::Comm* world = nullptr);

}  // namespace mt
