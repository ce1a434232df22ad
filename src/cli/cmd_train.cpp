#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "train/trainer.h"

namespace mt::cli {

namespace {
struct TrainArgs {
  std::string job;
  std::vector<std::string> set;
  bool resume = false;
  std::string resume_from;
};
}  // namespace

Command add_train_command(CLI::App& app, par::Comm* world) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* c = app.add_subcommand("train", "train (full or LoRA) as a TOML job describes");
  c->add_option("--job", a->job, "job file (TOML)")->required();
  c->add_option("--set", a->set, "override a job key: --set optim.lr=1e-3 (repeatable)");
  c->add_flag("--resume", a->resume, "continue from the run directory's latest checkpoint");
  c->add_option("--resume-from", a->resume_from, "continue from this checkpoint directory");
  return {c, [a, world] {
            Job job = Job::load(a->job, a->set);
            run_job(job, {.resume = a->resume, .resume_from = a->resume_from, .world = world},
                    std::cout);
            return 0;
          }};
}

}  // namespace mt::cli
