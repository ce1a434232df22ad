// Subcommands. Each cmd_<name>.cpp defines one add_<name>_command(): it registers its options on
// the app and returns the action to run when the user chose it (an exit code). main.cpp lists
// them; library errors propagate to main, which turns them into messages and exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "train/job.h"

namespace mt::par {
class Comm;
}

namespace mt::cli {

struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
};

Command add_demo_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_data_command(CLI::App& app);
// world: the job's processes when started by mpirun, else null (one process).
Command add_train_command(CLI::App& app, par::Comm* world);
// world: as train's (tune: every rank runs each trial; rank 0 reports).
Command add_tune_command(CLI::App& app, par::Comm* world);
Command add_eval_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_forward_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_report_command(CLI::App& app);
Command add_simulate_routing_command(CLI::App& app);
Command add_bench_command(CLI::App& app);

// The commands that read either a training checkpoint or an HF model directory (cli/
// checkpoint_args.cpp). --checkpoint DIR or --model DIR, not both (`model_help` says what --model
// reads); need_checkpoint_or_model refuses neither (ValueError naming `cmd`).
void add_checkpoint_or_model(CLI::App* c, std::string& checkpoint, std::string& model,
                             const std::string& model_help);
void need_checkpoint_or_model(const char* cmd, const std::string& checkpoint,
                              const std::string& model);
// A checkpoint directory as given, or the latest one when `dir` is a run's checkpoints/.
std::string resolve_checkpoint(const std::string& dir);
// The checkpoint's job and its model with the checkpoint's weights (no optimizer state).
struct CheckpointModel {
  Job job;
  std::unique_ptr<Model> model;
};
CheckpointModel load_checkpoint_model(const std::string& dir);

}  // namespace mt::cli
