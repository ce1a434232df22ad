#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "train/bench_step.h"
#include "train/files.h"

namespace mt::cli {

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<StepBenchOptions>();
  auto json_out = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("bench", "benchmarks that print JSON (see docs/gpu.md)");
  CLI::App* s = c->add_subcommand("step", "time one training step of a model on one device");
  c->require_subcommand(1);
  s->add_option("--model", o->model, "preset, config.json or HF model directory")->required();
  s->add_option("--tokens", o->tokens, "tokens per step (one document)")->capture_default_str();
  s->add_option("--steps", o->steps, "timed steps")->capture_default_str();
  s->add_option("--warmup", o->warmup, "untimed steps first")->capture_default_str();
  s->add_option("--lora-rank", o->lora_rank, "LoRA rank (0: full training)")->capture_default_str();
  s->add_option("--precision", o->precision, "fp32 or bf16")->capture_default_str();
  s->add_option("--device", o->device, "cpu, cuda or auto")->capture_default_str();
  s->add_option("--workspace-gib", o->workspace_gib,
                "op scratch on the device (0: the planner's estimate)")
      ->capture_default_str();
  s->add_flag("--deterministic", o->deterministic, "bit-repeatable GPU kernels");
  s->add_option("--peak-tflops", o->peak_tflops, "device peak for MFU (0: H200 bf16 dense, 989)");
  s->add_option("--json", *json_out, "also write the result to this file");
  return {c, [o, json_out] {
            if (o->lora_rank == 0) o->lora_targets.clear();
            const nlohmann::json j = run_step_bench(*o, std::cerr);
            std::cout << j.dump() << "\n";
            if (!json_out->empty()) write_file_atomic(*json_out, j.dump(2) + "\n");
            return 0;
          }};
}

}  // namespace mt::cli
