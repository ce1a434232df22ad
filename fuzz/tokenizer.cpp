// Fuzz target: tokenizer files through Tokenizer::load, then an encode and decode. The first byte
// picks the format: 'j' tokenizer.json, 't' tiktoken.model (HfTokenizer), anything else a
// sentencepiece tokenizer.model. The rest is that file, for the HF formats optionally followed by
// a NUL byte and tokenizer_config.json (bos/eos, added tokens). What loads must encode a text of
// code, accented and CJK characters and special tokens into ids below its vocabulary, and decode
// them.
#include <cstring>

#include "fuzz/fuzz_target.h"
#include "train/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return mt::fuzz::run_one([&] {
    if (size == 0) return;
    const char kind = static_cast<char>(data[0]);
    const char* p = reinterpret_cast<const char*>(data) + 1;
    const size_t n = size - 1;
    // A sentencepiece model is binary (protobuf, NUL bytes included) and has no config file.
    const bool hf = kind == 'j' || kind == 't';
    const char* nul = hf ? static_cast<const char*>(std::memchr(p, 0, n)) : nullptr;
    const size_t file_len = nul ? static_cast<size_t>(nul - p) : n;
    const std::filesystem::path dir = mt::fuzz::scratch() / "tokenizer";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string name = kind == 'j'   ? "tokenizer.json"
                             : kind == 't' ? "tiktoken.model"
                                           : "tokenizer.model";
    const std::string path = mt::fuzz::write_scratch("tokenizer/" + name, p, file_len);
    if (nul) mt::fuzz::write_scratch("tokenizer/tokenizer_config.json", nul + 1, n - file_len - 1);
    const mt::Tokenizer tok = mt::Tokenizer::load(path);
    const std::vector<int32_t> ids =
        tok.encode("def f(x):\n  return x  # \xc3\xa9t\xc3\xa9 \xe4\xb8\xad <|im_end|></s>\t\r\n");
    for (int32_t id : ids)
      if (id < 0 || id >= tok.vocab()) std::abort();
    (void)tok.decode(ids);
  });
}
