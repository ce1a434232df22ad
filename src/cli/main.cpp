// moetrain command-line entry point. Library code throws typed errors; this is the only place
// that turns them into messages and exit codes: 0 ok, 1 bad input or failed run, 2 usage,
// 3 internal error.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"moetrain " MOETRAIN_VERSION
               " - fine-tune hybrid KDA/DSA Mixture-of-Experts models"};
  app.set_version_flag("--version", std::string("moetrain ") + MOETRAIN_VERSION);
  app.require_subcommand(1);
  const std::vector<mt::cli::Command> commands = {
      mt::cli::add_demo_command(app),     mt::cli::add_info_command(app),
      mt::cli::add_data_command(app),     mt::cli::add_train_command(app),
      mt::cli::add_eval_command(app),     mt::cli::add_export_command(app),
      mt::cli::add_plan_command(app),     mt::cli::add_forward_command(app),
      mt::cli::add_generate_command(app), mt::cli::add_report_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (const auto& c : commands)
    if (c.sub->parsed()) return c.run();
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "moetrain: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moetrain: internal error: %s\n", e.what());
    return 3;
  }
}
