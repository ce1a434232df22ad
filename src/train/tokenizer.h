// A byte-fallback BPE tokenizer (sentencepiece). Trained without normalisation so that
// decode(encode(text)) == text for any valid UTF-8 (spaces, tabs and newlines included): code
// indentation survives, and unseen characters fall back to byte pieces instead of <unk>.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
  static Tokenizer load(const std::string& path);  // IoError naming the path
  void save(const std::string& path) const;        // temporary name, then rename

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // ValueError on ids >= vocab
  int64_t vocab() const;
  int32_t eos() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when `s` is well-formed UTF-8 (sentencepiece would replace bad bytes, breaking the
// round trip).
bool valid_utf8(const std::string& s);

}  // namespace mt
