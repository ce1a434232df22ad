#include "train/prepare.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mt {

namespace {

// Interleaved image-text inputs: the same split rule and outputs, one document per sequence.
PrepareResult prepare_images(const PrepareOptions& o, std::ostream& log) {
  namespace fs = std::filesystem;
  PrepareResult r;
  std::vector<InterleavedDoc> docs, train, held;
  for (const std::string& f : o.corpus.inputs)
    for (InterleavedDoc& d : read_interleaved(f)) docs.push_back(std::move(d));
  const auto cut = static_cast<uint64_t>(o.heldout * 10000.0);
  for (const InterleavedDoc& d : docs)
    ((fnv1a64(d.source.data(), d.source.size()) >> 16) % 10000 < cut ? held : train).push_back(d);
  MT_CHECK(!train.empty() && (o.heldout == 0 || !held.empty()), ValueError, "too few documents (",
           docs.size(), ") for a train and a held-out split");
  MT_CHECK(!o.tokenizer.empty(), ValueError,
           "image data needs --tokenizer (its vocabulary must leave room for the image token)");
  fs::create_directories(o.out);
  Tokenizer tok = Tokenizer::load(o.tokenizer);
  tok.save((fs::path(o.out) / "tokenizer.model").string());
  PackedData tp = pack_interleaved(train, tok, o.seq_len, o.images);
  write_dataset(tp, (fs::path(o.out) / "train").string());
  r.train_docs = static_cast<int64_t>(train.size());
  r.train_tokens = tp.target_tokens();
  if (!held.empty()) {
    PackedData hp = pack_interleaved(held, tok, o.seq_len, o.images);
    write_dataset(hp, (fs::path(o.out) / "heldout").string());
    r.heldout_docs = static_cast<int64_t>(held.size());
    r.heldout_tokens = hp.target_tokens();
  }
  log << "prepared " << o.out << ": " << r.train_docs << " train documents (" << r.train_tokens
      << " target tokens), " << r.heldout_docs << " held-out (" << r.heldout_tokens
      << "), images with token id " << o.images.image_token_id << "\n";
  return r;
}

}  // namespace

PrepareResult prepare_data(const PrepareOptions& o, std::ostream& log) {
  namespace fs = std::filesystem;
  MT_CHECK(!o.out.empty(), ValueError, "data prepare needs an output directory");
  if (o.images.image_token_id >= 0) return prepare_images(o, log);
  PrepareResult r;
  std::vector<Document> docs = read_corpus(o.corpus, &r.skipped), train, held;
  split_corpus(docs, o.heldout, train, held);
  MT_CHECK(!train.empty(), ValueError, "the training split of ", o.corpus.inputs.front(),
           " is empty (", docs.size(), " documents)");
  MT_CHECK(o.heldout == 0 || !held.empty(), ValueError, "the held-out split of ",
           o.corpus.inputs.front(), " is empty: too few documents (", docs.size(), ")");
  fs::create_directories(o.out);
  Tokenizer tok;
  const bool pretokenized =
      std::any_of(docs.begin(), docs.end(), [](const Document& d) { return !d.ids.empty(); });
  MT_CHECK(!pretokenized || !o.tokenizer.empty(), ValueError, o.corpus.inputs.front(),
           " holds token ids (input_ids): give the --tokenizer they were made with");
  if (o.tokenizer.empty()) {
    std::vector<std::string> texts;
    for (const Document& d : train) texts.push_back(d.prompt + d.text);
    tok = Tokenizer::train(texts, {.vocab = o.vocab});
  } else {
    tok = Tokenizer::load(o.tokenizer);
  }
  const std::string tok_path = tok.save_into(o.out);
  PackedData tp = pack_documents(train, tok, o.seq_len);
  write_dataset(tp, (fs::path(o.out) / "train").string());
  r.train_docs = static_cast<int64_t>(train.size());
  r.train_tokens = tp.target_tokens();
  if (!held.empty()) {
    PackedData hp = pack_documents(held, tok, o.seq_len);
    write_dataset(hp, (fs::path(o.out) / "heldout").string());
    r.heldout_docs = static_cast<int64_t>(held.size());
    r.heldout_tokens = hp.target_tokens();
  }
  nlohmann::json info = {{"inputs", o.corpus.inputs},       {"tokenizer", tok_path},
                         {"vocab_size", tok.vocab()},       {"seq_len", o.seq_len},
                         {"train_documents", r.train_docs}, {"heldout_documents", r.heldout_docs},
                         {"train_tokens", r.train_tokens},  {"heldout_tokens", r.heldout_tokens},
                         {"skipped_not_utf8", r.skipped}};
  std::ofstream(fs::path(o.out) / "prepare.json") << info.dump(2) << "\n";
  log << "prepared " << o.out << ": " << r.train_docs << " train documents (" << r.train_tokens
      << " tokens), " << r.heldout_docs << " held-out (" << r.heldout_tokens << " tokens), vocab "
      << tok.vocab() << (r.skipped ? cat(", skipped ", r.skipped, " non-UTF-8 documents") : "")
      << "\n";
  return r;
}

}  // namespace mt
