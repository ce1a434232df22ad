#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "train/demo.h"

namespace mt::cli {

Command add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* c =
      app.add_subcommand("demo", "train a preset model on built-in text and report held-out loss");
  c->add_option("--model", o->model, "preset (tiny, small) or config.json path")
      ->capture_default_str();
  c->add_option("--steps", o->steps, "optimizer steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--batch", o->batch, "sequences per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--seq", o->seq, "tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  c->add_option("--lr", o->lr, "peak learning rate")->capture_default_str();
  c->add_option("--seed", o->seed, "random seed")->capture_default_str();
  c->add_option("--threads", o->threads, "CPU threads (0: all)")->capture_default_str();
  c->add_option("--corpus", o->corpus_dir, "directory of text files")->capture_default_str();
  return {c, [o] {
            DemoResult r = run_demo(*o, std::cout);
            return r.eval_after < r.eval_before ? 0 : 1;
          }};
}

}  // namespace mt::cli
