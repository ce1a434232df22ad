// moetrain command-line entry point. Library code throws typed errors; this is the only place
// that turns them into messages and exit codes: 0 ok, 1 bad input or failed run, 2 usage,
// 3 internal error. Under mpirun, main owns MPI (MpiRuntime) and hands the world communicator to
// the commands that use it; a rank that fails prints "rank R failed: ..." and ends every rank of
// the job (MPI_Abort), so no peer waits for it.
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "parallel/comm.h"

namespace {

int run(int argc, char** argv, mt::par::Comm* world) {
  CLI::App app{"moetrain " MOETRAIN_VERSION
               " - fine-tune hybrid KDA/DSA Mixture-of-Experts models"};
  app.set_version_flag("--version", std::string("moetrain ") + MOETRAIN_VERSION);
  app.require_subcommand(1);
  const std::vector<mt::cli::Command> commands = {
      mt::cli::add_demo_command(app),        mt::cli::add_info_command(app),
      mt::cli::add_data_command(app),        mt::cli::add_train_command(app, world),
      mt::cli::add_tune_command(app, world), mt::cli::add_eval_command(app),
      mt::cli::add_export_command(app),      mt::cli::add_plan_command(app),
      mt::cli::add_forward_command(app),     mt::cli::add_generate_command(app),
      mt::cli::add_report_command(app),      mt::cli::add_simulate_routing_command(app),
      mt::cli::add_bench_command(app),
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

// On a mesh one rank's error would leave the others blocked in a collective: end the job.
int fail(mt::par::Comm* world, int code, const char* what, const char* msg) {
  if (world && world->size() > 1) {
    std::fprintf(stderr, "moetrain: rank %d failed: %s%s\n", world->rank(), what, msg);
    std::fflush(stderr);
    world->abort(code);
  }
  std::fprintf(stderr, "moetrain: %s%s\n", what, msg);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<mt::par::MpiRuntime> mpi;
  std::unique_ptr<mt::par::Comm> world;
  try {
    if (mt::par::MpiRuntime::launched_by_mpirun()) {
      mpi.emplace(&argc, &argv);
      world = mpi->world();
    }
    return run(argc, argv, world.get());
  } catch (const mt::Error& e) {
    return fail(world.get(), 1, "", e.what());
  } catch (const std::exception& e) {
    return fail(world.get(), 3, "internal error: ", e.what());
  }
}
