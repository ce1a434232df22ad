#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "train/prepare.h"

namespace mt::cli {

Command add_data_command(CLI::App& app) {
  auto o = std::make_shared<PrepareOptions>();
  CLI::App* c = app.add_subcommand("data", "prepare training data");
  c->require_subcommand(1);
  CLI::App* p = c->add_subcommand(
      "prepare", "text / JSON-lines files -> tokenizer + packed train and held-out token shards");
  p->add_option("inputs", o->corpus.inputs, "files or directories (*.jsonl: JSON lines)")
      ->required();
  p->add_option("--out", o->out, "output directory")->required();
  p->add_option(
      "--tokenizer", o->tokenizer,
      "existing tokenizer.model, or an HF model directory (tokenizer.json or tiktoken.model; "
      "default: train one)");
  p->add_option("--vocab", o->vocab, "vocabulary of a trained tokenizer")->capture_default_str();
  p->add_option("--seq", o->seq_len, "tokens per packed sequence")->capture_default_str();
  p->add_option("--heldout", o->heldout, "held-out fraction (by document)")->capture_default_str();
  p->add_option("--ext", o->corpus.extension, "in directories, only files with this ending");
  p->add_option("--separator", o->corpus.separator,
                "a line equal to this ends a document in text files (e.g. %)");
  p->add_option("--max-bytes", o->corpus.max_bytes, "read at most this many bytes (0: all)")
      ->capture_default_str();
  p->add_option("--image-token-id", o->images.image_token_id,
                "inputs are interleaved image-text JSON lines; this id marks image placeholders");
  p->add_option("--patch-size", o->images.processor.patch_size, "image patch size (pixels)")
      ->capture_default_str();
  p->add_option("--max-image-patches", o->images.processor.max_patches,
                "images are shrunk to at most this many patches")
      ->capture_default_str();
  p->add_option("--max-image-side", o->images.processor.max_side_patches,
                "and at most this many patches per side")
      ->capture_default_str();
  p->add_option("--max-image-pixels", o->images.limits.max_pixels, "larger image files are refused")
      ->capture_default_str();
  return {c, [o] {
            prepare_data(*o, std::cout);
            return 0;
          }};
}

}  // namespace mt::cli
