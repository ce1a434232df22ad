#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "train/demo.h"

namespace mt::cli {

Command add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* c = app.add_subcommand(
      "demo", "pretrain on code, LoRA-tune on prose, report held-out losses (Debian corpora)");
  c->add_option("--model", o->model, "preset (tiny, small) or config.json path")
      ->capture_default_str();
  c->add_option("--steps", o->steps, "pretraining steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--lora-steps", o->lora_steps, "LoRA steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--lora-rank", o->lora_rank, "LoRA rank")->capture_default_str();
  c->add_option("--batch", o->batch, "sequences per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--seq", o->seq, "tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  c->add_option("--lr", o->lr, "peak learning rate (pretraining)")->capture_default_str();
  c->add_option("--lora-lr", o->lora_lr, "peak learning rate (LoRA)")->capture_default_str();
  c->add_option("--seed", o->seed, "random seed")->capture_default_str();
  c->add_option("--threads", o->threads, "CPU threads (0: all)")->capture_default_str();
  c->add_option("--code", o->code_dir, "code corpus directory (*.py)")->capture_default_str();
  c->add_option("--prose", o->prose_dir, "prose corpus (fortune files)")->capture_default_str();
  c->add_option("--code-bytes", o->code_bytes, "read at most this much code")
      ->capture_default_str();
  c->add_option("--eval-sequences", o->eval_sequences, "held-out sequences per corpus")
      ->capture_default_str();
  c->add_option("--work", o->work_dir, "directory for data, runs and checkpoints")
      ->capture_default_str();
  return {c, [o] {
            DemoResult r = run_demo(*o, std::cout);
            return r.targets_met() ? 0 : 1;
          }};
}

}  // namespace mt::cli
