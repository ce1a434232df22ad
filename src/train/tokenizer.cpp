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
  std::unique_ptr<HfTokenizer> hf;  // set: an HF tokenizer, sp unused
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
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string name = p.filename().string();
  if (fs::is_directory(p) || name == "tokenizer.json" || name == "tiktoken.model") {
    Tokenizer t;
    t.impl_->hf = std::make_unique<HfTokenizer>(
        HfTokenizer::load(fs::is_directory(p) ? path : p.parent_path().string()));
    MT_CHECK(t.impl_->hf->eos() >= 0, ConfigError, path,
             ": the tokenizer has no eos_token (tokenizer_config.json); documents need one");
    return t;
  }
  MT_CHECK(fs::is_regular_file(path), IoError, "tokenizer '", path, "' does not exist");
  Tokenizer t;
  auto st = t.impl_->sp.Load(path);
  MT_CHECK(st.ok(), IoError, "tokenizer '", path, "' does not load: ", st.ToString());
  return t;
}

void Tokenizer::save(const std::string& path) const {
  MT_CHECK(!impl_->hf, ValueError, "an HF tokenizer is saved as a directory (save_into)");
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    std::string proto = impl_->sp.serialized_model_proto();
    out.write(proto.data(), static_cast<std::streamsize>(proto.size()));
    MT_CHECK(out.good(), IoError, "cannot write tokenizer '", tmp, "'");
  }
  std::filesystem::rename(tmp, path);
}

std::string Tokenizer::save_into(const std::string& dir) const {
  namespace fs = std::filesystem;
  if (!impl_->hf) {
    const std::string path = (fs::path(dir) / "tokenizer.model").string();
    save(path);
    return path;
  }
  const fs::path out = fs::path(dir) / "tokenizer", tmp = fs::path(dir) / "tokenizer.tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  for (const std::string& f : impl_->hf->files())
    fs::copy_file(f, tmp / fs::path(f).filename(), fs::copy_options::overwrite_existing);
  fs::remove_all(out);
  fs::rename(tmp, out);
  return out.string();
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  if (impl_->hf) return impl_->hf->encode(text);
  std::vector<int> ids;
  auto st = impl_->sp.Encode(text, &ids);
  MT_CHECK(st.ok(), ValueError, "tokenizer encode failed: ", st.ToString());
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (impl_->hf) return impl_->hf->decode(ids);
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
  return impl_->hf ? impl_->hf->vocab() : impl_->sp.GetPieceSize();
}
int32_t Tokenizer::eos() const {
  return impl_->hf ? impl_->hf->eos() : impl_->sp.eos_id();
}
int32_t Tokenizer::document_bos() const {
  return impl_->hf && impl_->hf->add_bos() ? impl_->hf->bos() : -1;
}

}  // namespace mt
