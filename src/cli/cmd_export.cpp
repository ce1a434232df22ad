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
  add_checkpoint_or_model(c, a->checkpoint, a->model,
                          "HF model directory to rewrite as f32 (--format hf; FP8 dequantised)");
  c->add_option("--format", a->format, "peft (LoRA adapter) or hf (merged weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"peft", "hf"}));
  c->add_option("--out", a->out, "output directory")->required();
  return {c, [a] {
            need_checkpoint_or_model("export", a->checkpoint, a->model);
            if (!a->model.empty()) {
              std::cout << export_model_dir(
                               a->model, a->format, a->out,
                               progress_printer(std::cerr, a->model, isatty(fileno(stderr))))
                        << "\n";
              return 0;
            }
            std::cout << export_checkpoint(resolve_checkpoint(a->checkpoint), a->format, a->out)
                      << "\n";
            return 0;
          }};
}

}  // namespace mt::cli
