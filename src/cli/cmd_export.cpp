#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "train/checkpoint.h"
#include "train/export.h"

namespace mt::cli {

namespace {
struct ExportArgs {
  std::string checkpoint, format = "peft", out;
};
}  // namespace

Command add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* c = app.add_subcommand("export", "write a checkpoint as a PEFT adapter or HF weights");
  c->add_option("--checkpoint", a->checkpoint, "checkpoint directory (or a run's checkpoints/)")
      ->required();
  c->add_option("--format", a->format, "peft (LoRA adapter) or hf (merged weights)")
      ->capture_default_str()
      ->check(CLI::IsMember({"peft", "hf"}));
  c->add_option("--out", a->out, "output directory")->required();
  return {c, [a] {
            std::string ck = a->checkpoint;
            if (std::string l = latest_checkpoint(ck); !l.empty()) ck = l;
            std::cout << export_checkpoint(ck, a->format, a->out) << "\n";
            return 0;
          }};
}

}  // namespace mt::cli
