// `moetrain report RUN_DIR`: plots of a run's metrics.jsonl (written by the trainer) rendered to
// PNG with gnuplot (Debian gnuplot-nox). Reads the trainer's fields:
//   training lines {"step", "loss", "lr", "grad_norm", "tokens_per_s",
//                   "expert_load": [{"layer", "max_over_mean", "hot_cold", "dead"}...]}
//   eval lines     {"step", "eval": {corpus: {"loss", ...}}}
// and writes <run_dir>/plots/{loss,throughput,optim,expert_load}.png (expert_load only when the
// run has MoE layers), each rendered under a temporary name and renamed into place.
#pragma once

#include <string>
#include <vector>

namespace mt {

// Returns the PNG paths written. IoError: no such run directory, no metrics.jsonl, gnuplot
// missing or failing; ValueError: a malformed line (named by file:line) or no metrics at all.
std::vector<std::string> render_report(const std::string& run_dir,
                                       const std::string& gnuplot = "gnuplot");

}  // namespace mt
