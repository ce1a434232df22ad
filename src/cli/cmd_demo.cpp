#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "train/demo.h"

namespace mt::cli {

namespace {

// The OpenMP runtime reads its wait policy once, when the library loads, so the demo sets it by
// running itself again. Spinning OpenMP workers and a multi-threaded BLAS pool starve each other
// on a shared 2-core machine (3-5x slower layers, bench/RESULTS.md). An explicit setting in the
// environment is kept; a failed exec just continues in this process.
void reexec_with_thread_policy() {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t i = 0; i < raw.size();) {
    const size_t end = raw.find('\0', i);
    args.push_back(raw.substr(i, end - i));
    if (end == std::string::npos) break;
    i = end + 1;
  }
  if (args.empty()) return;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
}

}  // namespace

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
  c->add_option("--replay", o->replay,
                "share of code training files mixed into the LoRA data (keeps code loss)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
  c->add_option("--seed", o->seed, "random seed")->capture_default_str();
  c->add_option("--threads", o->threads, "CPU threads (0: all)")->capture_default_str();
  c->add_option("--code", o->code_dir, "code corpus directory (*.py)")->capture_default_str();
  c->add_option("--prose", o->prose_dir, "prose corpus (fortune files)")->capture_default_str();
  c->add_option("--code-bytes", o->code_bytes, "read at most this much code")
      ->capture_default_str();
  c->add_option("--eval-sequences", o->eval_sequences,
                "sequences scored per corpus and split (0: all)")
      ->capture_default_str();
  c->add_option("--work", o->work_dir, "directory for data, runs and checkpoints")
      ->capture_default_str();
  return {c, [o] {
            reexec_with_thread_policy();
            DemoResult r = run_demo(*o, std::cout);
            return r.targets_met() ? 0 : 1;
          }};
}

}  // namespace mt::cli
