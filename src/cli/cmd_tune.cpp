#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "parallel/comm.h"
#include "train/files.h"
#include "train/tune.h"

namespace mt::cli {

namespace {
struct TuneArgs {
  std::string job, model, device, out;
  std::vector<std::string> set;
  TuneOptions tune;
};
}  // namespace

Command add_tune_command(CLI::App& app, par::Comm* world) {
  auto a = std::make_shared<TuneArgs>();
  CLI::App* c = app.add_subcommand(
      "tune",
      "measure real training steps of a job under settings that Bayesian optimisation proposes "
      "over a grid of job keys, and report the fastest (docs/planner.md, \"Auto-tuner\")");
  c->add_option("--job", a->job, "job file (TOML)")->required();
  c->add_option("--space", a->tune.space,
                "the grid: job keys and the values to try, e.g. "
                "\"run.threads=1,2,4;train.recompute=none,full\", or auto (recompute; threads on "
                "the CPU; the grouped GEMM kernels on a GPU; all-to-all chunks and EP on a mesh)")
      ->required();
  c->add_option("--model", a->model, "HF model directory (its config; weights are not loaded)");
  c->add_option("--set", a->set, "override a job key in every trial (repeatable)");
  c->add_option("--device", a->device, "cpu, cuda or auto (= --set run.device=D)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  c->add_option("--trials", a->tune.trials, "settings measured at most, the job's own included")
      ->capture_default_str();
  c->add_option("--steps", a->tune.steps, "measured steps per trial (their median counts)")
      ->capture_default_str();
  c->add_option("--warmup", a->tune.warmup, "steps run first in each trial, not measured")
      ->capture_default_str();
  c->add_option("--initial", a->tune.initial,
                "random settings after the job's own, before the model proposes")
      ->capture_default_str();
  c->add_option("--min-gain", a->tune.min_gain,
                "stop once no untried setting is expected to be this much faster (0.005: 0.5%)")
      ->capture_default_str();
  c->add_option("--seed", a->tune.seed, "seed of the random start")->capture_default_str();
  c->add_flag("!--no-confirm", a->tune.confirm,
              "skip the confirmation (the job's own settings and the best once more each)");
  c->add_option("--work-dir", a->tune.work_dir,
                "keep the trials' run directories here (default: a temporary one, removed)");
  c->add_option("--out", a->out, "also write the trials and the result as JSON to this file");
  return {c, [a, world] {
            std::vector<std::string> set = a->set;
            if (!a->model.empty()) set.push_back("model.dir=\"" + a->model + "\"");
            if (!a->device.empty()) set.push_back("run.device=\"" + a->device + "\"");
            // Rank 0 speaks for the mesh; every rank takes the same decisions.
            const bool root = !world || world->rank() == 0;
            std::ostringstream others;
            const TuneResult r = tune_job(
                a->job, set, a->tune, root ? static_cast<std::ostream&>(std::cout) : others, world);
            if (root && !a->out.empty()) write_file_atomic(a->out, r.to_json().dump(2) + "\n");
            return r.best >= 0 ? 0 : 1;
          }};
}

}  // namespace mt::cli
