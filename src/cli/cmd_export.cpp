#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "train/checkpoint.h"
#include "train/export.h"

namespace mt::cli {

namespace {
struct ExportArgs {
  std::string checkpoint, model, format = "peft", out;
};
}  // namespace

Command add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* c = app.add_subcommand("export", "write a checkpoint as a PEFT adapter or HF weights");
  auto* ck_opt = c->add_option("--checkpoint", a->checkpoint,
                               "checkpoint directory (or a run's checkpoints/)");
  c->add_option("--model", a->model,
                "HF model directory to rewrite as f32 (--format hf; FP8 dequantised)")
      ->excludes(ck_opt);
  c->add_option("--format", a->format, "peft (LoRA adapter) or hf (merged weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"peft", "hf"}));
  c->add_option("--out", a->out, "output directory")->required();
  return {c, [a] {
            MT_CHECK(!a->checkpoint.empty() || !a->model.empty(), ValueError,
                     "export: give --checkpoint DIR or --model DIR");
            if (!a->model.empty()) {
              std::cout << export_model_dir(
                               a->model, a->format, a->out,
                               progress_printer(std::cerr, a->model, isatty(fileno(stderr))))
                        << "\n";
              return 0;
            }
            std::string ck = a->checkpoint;
            if (std::string l = latest_checkpoint(ck); !l.empty()) ck = l;
            std::cout << export_checkpoint(ck, a->format, a->out) << "\n";
            return 0;
          }};
}

}  // namespace mt::cli
