#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/job.h"

namespace mt::cli {

void add_checkpoint_or_model(CLI::App* c, std::string& checkpoint, std::string& model,
                             const std::string& model_help) {
  auto* ck_opt =
      c->add_option("--checkpoint", checkpoint, "checkpoint directory (or a run's checkpoints/)");
  c->add_option("--model", model, model_help)->excludes(ck_opt);
}

void need_checkpoint_or_model(const char* cmd, const std::string& checkpoint,
                              const std::string& model) {
  MT_CHECK(!checkpoint.empty() || !model.empty(), ValueError, cmd,
           ": give --checkpoint DIR or --model DIR");
}

std::string resolve_checkpoint(const std::string& dir) {
  std::string l = latest_checkpoint(dir);
  return l.empty() ? dir : l;
}

CheckpointModel load_checkpoint_model(const std::string& dir) {
  CheckpointModel m;
  const std::string ck = resolve_checkpoint(dir);
  m.job = Job::load(ck + "/job.toml");
  m.model = std::make_unique<Model>(job_model_config(m.job), m.job.seed, job_model_options(m.job));
  load_checkpoint(ck, *m.model, nullptr);
  return m;
}

}  // namespace mt::cli
