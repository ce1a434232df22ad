#include "train/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace mt {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

// Feeds in-memory lines to the trainer, so no temporary corpus file is needed.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& texts) : texts_(texts) { advance(); }
  bool done() const override { return doc_ >= texts_.size(); }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (doc_ < texts_.size()) {
      const std::string& t = texts_[doc_];
      if (pos_ >= t.size()) {
        ++doc_;
        pos_ = 0;
        continue;
      }
      size_t nl = t.find('\n', pos_);
      size_t end = nl == std::string::npos ? t.size() : nl;
      line_ = t.substr(pos_, end - pos_);
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
  }
  const std::vector<std::string>& texts_;
  size_t doc_ = 0, pos_ = 0;
  std::string line_;
};

}  // namespace

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::train(const std::vector<std::string>& texts,
                           const TokenizerTrainOptions& opt) {
  MT_CHECK(opt.vocab >= 300, ValueError, "tokenizer vocab ", opt.vocab,
           " is too small (256 byte pieces + specials + merges need >= 300)");
  // Identity normalisation and kept whitespace make encoding lossless; byte fallback covers
  // characters never seen in training; whitespace-only pieces let BPE learn indentation.
  std::string args =
      cat("--model_type=bpe --vocab_size=", opt.vocab,
          " --normalization_rule_name=identity --remove_extra_whitespaces=false"
          " --add_dummy_prefix=false --byte_fallback=true --allow_whitespace_only_pieces=true"
          " --split_digits=true --character_coverage=0.9995 --unk_id=0 --eos_id=1 --bos_id=-1"
          " --pad_id=-1 --max_sentence_length=8192 --shuffle_input_sentence=false"
          " --minloglevel=2 --input_sentence_size=",
          opt.max_sentences, " --num_threads=", opt.threads);
  LineIterator it(texts);
  MT_CHECK(!it.done(), ValueError, "tokenizer training corpus is empty");
  std::string proto;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  MT_CHECK(st.ok(), ValueError, "sentencepiece training failed: ", st.ToString());
  Tokenizer t;
  auto ls = t.impl_->sp.LoadFromSerializedProto(proto);
  MT_CHECK(ls.ok(), InternalError, "trained tokenizer does not load: ", ls.ToString());
  return t;
}

Tokenizer Tokenizer::load(const std::string& path) {
  MT_CHECK(std::filesystem::is_regular_file(path), IoError, "tokenizer '", path,
           "' does not exist");
  Tokenizer t;
  auto st = t.impl_->sp.Load(path);
  MT_CHECK(st.ok(), IoError, "tokenizer '", path, "' does not load: ", st.ToString());
  return t;
}

void Tokenizer::save(const std::string& path) const {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    std::string proto = impl_->sp.serialized_model_proto();
    out.write(proto.data(), static_cast<std::streamsize>(proto.size()));
    MT_CHECK(out.good(), IoError, "cannot write tokenizer '", tmp, "'");
  }
  std::filesystem::rename(tmp, path);
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  auto st = impl_->sp.Encode(text, &ids);
  MT_CHECK(st.ok(), ValueError, "tokenizer encode failed: ", st.ToString());
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int64_t v = vocab();
  for (size_t i = 0; i < ids.size(); ++i)
    MT_CHECK(ids[i] >= 0 && ids[i] < v, ValueError, "token id ", ids[i], " at position ", i,
             " is outside the tokenizer vocabulary [0, ", v, ")");
  std::string out;
  auto st = impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  MT_CHECK(st.ok(), ValueError, "tokenizer decode failed: ", st.ToString());
  return out;
}

int64_t Tokenizer::vocab() const {
  return impl_->sp.GetPieceSize();
}
int32_t Tokenizer::eos() const {
  return impl_->sp.eos_id();
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += len;
  }
  return true;
}

}  // namespace mt
