#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "train/trainer.h"

namespace mt::cli {

namespace {
struct TrainArgs {
  std::string job, model;
  std::vector<std::string> set;
  bool resume = false;
  std::string resume_from;
  std::string plan, device;
  double mem_gb = -1;
  bool dry_run = false;
};
}  // namespace

Command add_train_command(CLI::App& app, par::Comm* world) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* c = app.add_subcommand("train", "train (full or LoRA) as a TOML job describes");
  c->add_option("--job", a->job, "job file (TOML)")->required();
  c->add_option("--model", a->model,
                "HF model directory to fine-tune: its config and weights (= --set model.dir=DIR)");
  c->add_option("--set", a->set, "override a job key: --set optim.lr=1e-3 (repeatable)");
  c->add_flag("--resume", a->resume, "continue from the run directory's latest checkpoint");
  c->add_option("--resume-from", a->resume_from, "continue from this checkpoint directory");
  c->add_option("--device", a->device,
                "cpu, cuda or auto (= --set run.device=D); under mpirun with cuda each rank takes "
                "GPU local rank % GPUs and the trainer's collectives run over NCCL")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  c->add_option("--plan", a->plan,
                "auto: the planner chooses ep, a2a_chunks, shard_experts and the micro-batch "
                "(= --set parallel.plan=auto); manual: the job's [parallel] keys")
      ->check(CLI::IsMember({"auto", "manual"}));
  c->add_option("--mem-gb", a->mem_gb,
                "memory limit per rank for --plan auto (= --set parallel.mem_gb=M; default: "
                "host memory / ranks)")
      ->check(CLI::PositiveNumber);
  c->add_flag("--dry-run", a->dry_run,
              "build the mesh, the model and its shards, print what each rank holds, and stop");
  return {c, [a, world] {
            // The flags are job keys, so the resolved job.toml records them like --set does.
            std::vector<std::string> set = a->set;
            if (!a->model.empty()) set.push_back("model.dir=\"" + a->model + "\"");
            if (!a->plan.empty()) set.push_back("parallel.plan=" + a->plan);
            if (!a->device.empty()) set.push_back("run.device=\"" + a->device + "\"");
            if (a->mem_gb > 0) {
              std::ostringstream v;
              v << std::setprecision(17) << a->mem_gb;
              set.push_back("parallel.mem_gb=" + v.str());
            }
            Job job = Job::load(a->job, set);
            run_job(job,
                    {.resume = a->resume,
                     .resume_from = a->resume_from,
                     .world = world,
                     .dry_run = a->dry_run},
                    std::cout);
            return 0;
          }};
}

}  // namespace mt::cli
