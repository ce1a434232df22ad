// moetrain command-line entry point. Library code throws typed errors; this is the only place
// that turns them into messages and exit codes (0 ok, 1 bad input or failed run, 2 usage).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "core/error.h"
#include "model/model.h"
#include "train/demo.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"moetrain " MOETRAIN_VERSION
               " - fine-tune hybrid KDA/DSA Mixture-of-Experts models"};
  app.set_version_flag("--version", std::string("moetrain ") + MOETRAIN_VERSION);
  app.require_subcommand(1);

  mt::DemoOptions demo;
  CLI::App* demo_cmd =
      app.add_subcommand("demo", "train a preset model on built-in text and report held-out loss");
  demo_cmd->add_option("--model", demo.model, "preset (tiny, small) or config.json path")
      ->capture_default_str();
  demo_cmd->add_option("--steps", demo.steps, "optimizer steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  demo_cmd->add_option("--batch", demo.batch, "sequences per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  demo_cmd->add_option("--seq", demo.seq, "tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  demo_cmd->add_option("--lr", demo.lr, "peak learning rate")->capture_default_str();
  demo_cmd->add_option("--seed", demo.seed, "random seed")->capture_default_str();
  demo_cmd->add_option("--threads", demo.threads, "CPU threads (0: all)")->capture_default_str();
  demo_cmd->add_option("--corpus", demo.corpus_dir, "directory of text files")
      ->capture_default_str();

  std::string info_model = "small";
  CLI::App* info_cmd = app.add_subcommand("info", "describe a model: layers and parameter counts");
  info_cmd->add_option("model", info_model, "preset (tiny, small, seed-2.8t) or config.json path")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (demo_cmd->parsed()) {
    mt::DemoResult r = mt::run_demo(demo, std::cout);
    return r.eval_after < r.eval_before ? 0 : 1;
  }
  if (info_cmd->parsed()) {
    mt::ModelConfig cfg = mt::ModelConfig::load(info_model);
    int64_t total = 0, expert = 0;
    for (const mt::NamedSpec& s : mt::model_param_specs(cfg)) {
      total += s.spec.shape.numel();
      if (s.spec.role == mt::ParamRole::Expert) expert += s.spec.shape.numel();
    }
    std::cout << "model " << info_model << ": " << cfg.layers.size() << " layers (";
    for (size_t i = 0; i < cfg.layers.size(); ++i)
      std::cout << (i ? " " : "") << mt::mixer_name(cfg.layers[i].mixer)
                << (cfg.layers[i].ffn == mt::FfnKind::Dense ? "+ffn" : "+moe");
    std::cout << ")\nparameters: " << total << " total, " << expert << " in routed experts, "
              << total - expert << " other\n";
    return 0;
  }
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
