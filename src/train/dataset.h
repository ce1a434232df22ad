// Corpora and token datasets. A corpus is a list of documents read from text files (one per file,
// or split at separator lines such as fortune's "%") or JSON lines ({"text"}, {"prompt","response"}
// or, already tokenized, {"input_ids", "labels"} as tools/chat_ids.py writes them from a model's
// chat template: labels[i] is input_ids[i] where the loss counts, -100 where it does not).
// `prepare` tokenizes documents and packs them into fixed-length sequences: each sequence stores
// input ids, targets (the next token of the same document, or -100 where the loss is masked: prompt
// tokens, document ends, padding) and the lengths of its document segments, so packed documents
// never see each other (SeqInfo varlen).
//
// On disk (a directory): index.json (format, seq_len, vocab, segments per sequence, shard list
// with byte counts and FNV-1a checksums) and shard_NNNNN.bin (int32 little-endian: per sequence
// seq_len ids then seq_len targets).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/seq_info.h"
#include "core/tensor.h"
#include "model/vision/vision_front.h"
#include "train/tokenizer.h"

namespace mt {

inline constexpr int32_t kIgnoreIndex = -100;

struct Document {
  std::string text;    // trained on
  std::string prompt;  // conditioning only: its tokens are never targets
  std::string source;  // "file" or "file:line", for the split and for messages
  // Pre-tokenized documents: ids as they are (no bos/eos added), labels[i] = ids[i] or -100.
  std::vector<int32_t> ids, labels;
};

struct CorpusOptions {
  std::vector<std::string> inputs;  // files or directories (searched recursively)
  std::string extension;            // in directories, only files ending with this ("" = all)
  std::string separator;            // text files: a line equal to this ends a document
  int64_t max_bytes = 0;            // stop reading after this many bytes (0 = no limit)
};

// Reads every document; *.jsonl / *.json files are JSON lines, everything else text. Missing
// inputs and empty files are IoErrors naming the path; a malformed JSON line names file:line.
// Documents that are not valid UTF-8 are skipped (counted in `skipped`).
std::vector<Document> read_corpus(const CorpusOptions& opt, int64_t* skipped = nullptr);

// Deterministic split by a hash of each document's source: the same document always lands on the
// same side, whatever else the corpus holds.
void split_corpus(const std::vector<Document>& docs, double heldout_fraction,
                  std::vector<Document>& train, std::vector<Document>& heldout);
// Three ways by the same hash: the first `validation` fraction of hash buckets is the validation
// split (the held-out side of the two-way split above), the next `test` fraction the test split,
// the rest train.
void split_corpus(const std::vector<Document>& docs, double validation, double test,
                  std::vector<Document>& train, std::vector<Document>& val,
                  std::vector<Document>& tst);

struct PackedImages;

struct PackedData {
  int64_t seq_len = 0;
  int64_t vocab = 0;
  std::vector<int32_t> ids, targets;           // [sequences * seq_len]
  std::vector<std::vector<int64_t>> segments;  // per sequence, summing to seq_len
  int64_t documents = 0;
  std::shared_ptr<const PackedImages> images;  // interleaved image-text data (train/image_data.h)
  int64_t sequences() const { return static_cast<int64_t>(segments.size()); }
  int64_t target_tokens() const;  // targets that count in the loss
};

PackedData pack_documents(const std::vector<Document>& docs, const Tokenizer& tok, int64_t seq_len);

void write_dataset(const PackedData& data, const std::string& dir);  // temp dir, then rename
// Checks checksums, sizes, ids < vocab; a dataset without sequences is an IoError.
PackedData load_dataset(const std::string& dir);

// The sequences `indices` as one packed batch (ids/targets i32 [count*seq_len]); at least one.
struct Batch {
  SeqInfo seq;
  Tensor ids, targets;
  int64_t target_tokens = 0;
  ImageBatch images;  // empty for text-only data
};
Batch make_batch(const PackedData& data, const std::vector<int64_t>& indices);

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

}  // namespace mt
