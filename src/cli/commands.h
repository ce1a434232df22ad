// Subcommands. Each cmd_<name>.cpp defines one add_<name>_command(): it registers its options on
// the app and returns the action to run when the user chose it (an exit code). main.cpp lists
// them; library errors propagate to main, which turns them into messages and exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

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
Command add_eval_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_forward_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_report_command(CLI::App& app);
Command add_simulate_routing_command(CLI::App& app);
Command add_bench_command(CLI::App& app);

}  // namespace mt::cli
