// The tokenizers HuggingFace model directories ship, in C++: `tokenizer.json` byte-level BPE
// (DeepSeek-V3, Qwen3 and GPT-2-style settings: Unicode normalisers, Split/ByteLevel
// pre-tokenizers, added and special tokens) and tiktoken rank files (`tiktoken.model` with Kimi's
// pattern and the special tokens of `tokenizer_config.json`). Ids equal those of the Python
// `tokenizers` and `tiktoken` libraries (tests/io/test_hf_tokenizer.cpp, goldens from
// tools/make_tokenizers.py). Regexes run on PCRE2 (Unicode classes, lookahead), normalisation on
// utf8proc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt {

// True when `s` is well-formed UTF-8.
bool valid_utf8(const std::string& s);

class HfTokenizer {
 public:
  HfTokenizer();
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  // True when `dir` holds tokenizer.json or tiktoken.model.
  static bool present(const std::string& dir);
  // tokenizer.json wins over tiktoken.model; tokenizer_config.json (optional) supplies bos/eos and
  // add_bos_token. Unsupported settings are one-line ConfigErrors naming the file and the key.
  static HfTokenizer load(const std::string& dir);

  // Special and added tokens written in `text` map to their ids (tiktoken's allowed_special="all",
  // `tokenizers`' default); no BOS/EOS is added. ValueError on invalid UTF-8.
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // ValueError on unknown ids
  int64_t vocab() const;                                      // largest id + 1
  int32_t bos() const;                                        // -1 when there is none
  int32_t eos() const;
  bool add_bos() const;  // the model's tokenizer puts bos before every text
  // The files the tokenizer was read from (to copy next to prepared data).
  const std::vector<std::string>& files() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt
