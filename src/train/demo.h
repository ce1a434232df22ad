// `moetrain demo`: the training application end to end on corpora every Debian system with the
// setup packages has. Code (the Python standard library sources) and prose (the fortunes
// package) are split by document into train / validation / test, a BPE tokenizer is trained on
// both training splits, the preset model is pretrained on code, then LoRA-fine-tuned on prose
// (with a replayed share of code training files) with its base frozen; losses of both corpora are
// compared before and after each stage, and a sample is generated from each stage.
//
// Honesty of the figures: every tuned choice (steps, replay share, rank, learning rates, the
// trained norm gains) was chosen on the validation split, which is the held-out split of the
// earlier two-way demo. The test split is a fresh slice of what used to be training documents,
// scored at the end of each stage and never tuned on; the targets are judged on it. The unigram
// baseline is scored on exactly the tokens the model is scored on. Both are scored on the whole of
// each split by default: a split is packed in file order, so its first 32 sequences (the earlier
// default) held one to three files of the seventeen (test: aifc.py alone), too few to judge a
// target on.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace mt {

struct DemoOptions {
  std::string model = "small";  // preset name or config.json path
  std::string code_dir = "/usr/lib/python3.11";
  std::string prose_dir = "/usr/share/games/fortunes";
  std::string work_dir = "runs/demo";
  int64_t code_bytes = 3 << 20;  // read at most this much code
  int64_t steps = 800;           // pretraining steps
  int64_t lora_steps = 750;
  int64_t lora_rank = 6;
  int64_t batch = 4;
  int64_t seq = 256;
  float lr = 3e-3f;
  float lora_lr = 5e-3f;
  uint64_t seed = 1;
  int threads = 0;
  int64_t eval_sequences = 0;  // per corpus and split; 0: the whole split
  double replay = 0.2;         // share of code (bytes) mixed into the LoRA stage's prose
};

// Losses on the test split; *_val on the validation split (what the choices were tuned on).
struct DemoResult {
  double unigram_code = 0, unigram_prose = 0, unigram_code_val = 0, unigram_prose_val = 0;
  double code_pretrained = 0, prose_pretrained = 0;  // after pretraining
  double code_lora = 0, prose_lora = 0;              // after LoRA
  double code_pretrained_val = 0, prose_pretrained_val = 0, code_lora_val = 0, prose_lora_val = 0;
  double lora_share = 0;  // trainable / total in the LoRA stage
  double pretrain_tokens_per_s = 0, lora_tokens_per_s = 0, seconds = 0;
  bool targets_met() const;
};

DemoResult run_demo(const DemoOptions& opt, std::ostream& log);

}  // namespace mt
