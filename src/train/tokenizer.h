// The tokenizer data is prepared with: either the engine's own byte-fallback BPE (sentencepiece),
// trained without normalisation so that decode(encode(text)) == text for any valid UTF-8 (code
// indentation survives, unseen characters fall back to byte pieces instead of <unk>), or the one a
// HuggingFace model directory ships (io/hf_tokenizer.h: tokenizer.json or tiktoken.model).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/hf_tokenizer.h"

namespace mt {

struct TokenizerTrainOptions {
  int64_t vocab = 4096;
  int64_t max_sentences = 400000;  // lines sampled for training (sentencepiece's own limit)
  int threads = 2;
};

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Trains on `texts` (split into lines; each line is one training sentence).
  static Tokenizer train(const std::vector<std::string>& texts, const TokenizerTrainOptions& opt);
  // A tokenizer.model file (sentencepiece), or a directory (or its tokenizer.json /
  // tiktoken.model) holding an HF tokenizer. IoError naming the path.
  static Tokenizer load(const std::string& path);
  void save(const std::string& path) const;  // sentencepiece only: temporary name, then rename
  // Writes the tokenizer into `dir` (tokenizer.model, or the HF files under tokenizer/) and
  // returns the path `load` takes.
  std::string save_into(const std::string& dir) const;

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // ValueError on ids >= vocab
  int64_t vocab() const;
  int32_t eos() const;
  // The token every document starts with (HF tokenizers whose model adds bos), else -1.
  int32_t document_bos() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
