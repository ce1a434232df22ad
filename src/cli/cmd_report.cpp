#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "train/report.h"

namespace mt::cli {

Command add_report_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("report", "render PNG plots of a run's metrics with gnuplot");
  c->add_option("run_dir", *dir, "run directory holding metrics.jsonl")->required();
  return {c, [dir] {
            for (const std::string& p : render_report(*dir)) std::cout << p << "\n";
            return 0;
          }};
}

}  // namespace mt::cli
