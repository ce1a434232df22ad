// `moetrain data prepare`: corpus files -> (optionally trained) tokenizer -> deterministic
// train / held-out split by document -> packed token datasets:
//   <out>/tokenizer.model (or, with an HF tokenizer, its files under <out>/tokenizer/),
//   <out>/train/, <out>/heldout/, <out>/prepare.json (counts).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "train/dataset.h"
#include "train/image_data.h"

namespace mt {

struct PrepareOptions {
  CorpusOptions corpus;
  std::string out;
  // existing tokenizer.model, or an HF model directory (or its tokenizer.json / tiktoken.model);
  // "" = train one on the training split
  std::string tokenizer;
  int64_t vocab = 4096;  // when training a tokenizer
  int64_t seq_len = 256;
  double heldout = 0.1;
  // image_token_id >= 0: the inputs are interleaved image-text JSON lines (train/image_data.h).
  ImageDataOptions images;
};

struct PrepareResult {
  int64_t train_docs = 0, heldout_docs = 0, train_tokens = 0, heldout_tokens = 0, skipped = 0;
};

PrepareResult prepare_data(const PrepareOptions& opt, std::ostream& log);

}  // namespace mt
