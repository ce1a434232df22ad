#include "train/dataset.h"

#include "train/image_data.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/json_integer.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kShardSequences = 512;
constexpr const char* kFormat = "moetrain-tokens-v1";

std::string read_file(const fs::path& p) {
  // An ifstream opens a directory and then throws an untyped error on the first read.
  MT_CHECK(!fs::is_directory(p), IoError, "'", p.string(), "' is a directory, not a file");
  std::ifstream in(p, std::ios::binary);
  MT_CHECK(in.good(), IoError, "cannot read '", p.string(), "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool is_jsonl(const fs::path& p) {
  return p.extension() == ".jsonl" || p.extension() == ".json";
}

// {"input_ids": [...], "labels": [...]}: labels equal the ids where the loss counts, else -100.
void read_token_line(const nlohmann::json& j, const std::string& where, Document& d) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    MT_CHECK(it.key() == "input_ids" || it.key() == "labels", IoError, where, ": unknown key '",
             it.key(), "' next to input_ids (expected labels)");
    MT_CHECK(it.value().is_array(), IoError, where, ": ", it.key(), " must be an array");
    std::vector<int32_t>& dst = it.key() == "input_ids" ? d.ids : d.labels;
    for (const auto& v : it.value()) {
      MT_CHECK(v.is_number_integer() && v.get<int64_t>() >= kIgnoreIndex &&
                   v.get<int64_t>() <= std::numeric_limits<int32_t>::max(),
               IoError, where, ": ", it.key(), " holds ", v.dump(), ", not a token id");
      dst.push_back(v.get<int32_t>());
    }
  }
  MT_CHECK(j.contains("labels"), IoError, where, ": input_ids without labels");
  MT_CHECK(d.ids.size() == d.labels.size(), IoError, where, ": ", d.ids.size(), " input_ids but ",
           d.labels.size(), " labels");
  MT_CHECK(d.ids.size() >= 2, IoError, where, ": fewer than 2 input_ids");
  for (size_t i = 0; i < d.ids.size(); ++i) {
    MT_CHECK(d.ids[i] >= 0, IoError, where, ": input_ids[", i, "] = ", d.ids[i], " is negative");
    MT_CHECK(d.labels[i] == d.ids[i] || d.labels[i] == kIgnoreIndex, IoError, where, ": labels[", i,
             "] = ", d.labels[i], " is neither input_ids[", i, "] nor -100");
  }
}

void read_jsonl(const fs::path& p, const std::string& text, std::vector<Document>& out) {
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl;
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string where = cat(p.string(), ":", line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      MT_THROW(IoError, where, ": not a JSON object: ", e.what());
    }
    MT_CHECK(j.is_object(), IoError, where, ": expected a JSON object");
    Document d{.source = where};
    if (j.contains("input_ids")) {
      read_token_line(j, where, d);
      out.push_back(std::move(d));
      continue;
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
      MT_CHECK(it.value().is_string(), IoError, where, ": key '", it.key(), "' must be a string");
      if (it.key() == "text" || it.key() == "response")
        d.text = it.value().get<std::string>();
      else if (it.key() == "prompt")
        d.prompt = it.value().get<std::string>();
      else
        MT_THROW(IoError, where, ": unknown key '", it.key(),
                 "' (expected text, or prompt and response)");
    }
    MT_CHECK(!(j.contains("text") && j.contains("response")), IoError, where,
             ": use either text or prompt/response");
    MT_CHECK(!d.text.empty(), IoError, where, ": empty text/response");
    out.push_back(std::move(d));
  }
}

void read_text(const fs::path& p, const std::string& text, const std::string& sep,
               std::vector<Document>& out) {
  if (sep.empty()) {
    out.push_back({.text = text, .source = p.string()});
    return;
  }
  std::string cur;
  size_t pos = 0;
  int64_t n = 0;
  auto flush = [&] {
    if (cur.find_first_not_of(" \t\r\n") != std::string::npos)
      out.push_back({.text = cur, .source = cat(p.string(), "#", n++)});
    cur.clear();
  };
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string line = text.substr(pos, end - pos);
    pos = end;
    std::string bare = line;
    while (!bare.empty() && (bare.back() == '\n' || bare.back() == '\r')) bare.pop_back();
    if (bare == sep)
      flush();
    else
      cur += line;
  }
  flush();
}

void write_bytes(const fs::path& p, const void* data, size_t n) {
  std::ofstream out(p, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  out.close();
  MT_CHECK(out.good(), IoError, "cannot write '", p.string(), "'");
}

// An integer of index.json: nlohmann's own cast of a float beyond T is undefined behaviour
// (model/json_integer.h), of a fraction a silent truncation.
template <typename T>
T index_integer(const nlohmann::json& v, const std::string& ip, const char* key) {
  MT_CHECK(v.is_number() && json_integer_fits<T>(v), IoError, ip, ": ", key, " = ", v.dump(),
           " is not an integer in range");
  return v.get<T>();
}

// Everything load_dataset reads from index.json and the shards it names. The caller turns JSON
// key and type errors into IoErrors; this checks what JSON cannot: sizes that agree with each
// other, so that no shard is read past its end (fuzz/corpus/token_shards).
void read_index(const nlohmann::json& index, const std::string& ip, const std::string& dir,
                PackedData& d) {
  d.seq_len = index_integer<int64_t>(index.at("seq_len"), ip, "seq_len");
  d.vocab = index_integer<int64_t>(index.at("vocab_size"), ip, "vocab_size");
  d.documents = index_integer<int64_t>(index.at("documents"), ip, "documents");
  const nlohmann::json& segments = index.at("segments");
  MT_CHECK(segments.is_array(), IoError, ip, ": segments is not an array");
  for (const auto& seq : segments) {
    MT_CHECK(seq.is_array(), IoError, ip, ": segments holds ", seq.dump(), ", not an array");
    d.segments.emplace_back();
    for (const auto& len : seq)
      d.segments.back().push_back(index_integer<int64_t>(len, ip, "segments"));
  }
  MT_CHECK(d.seq_len > 0 && d.seq_len <= (int64_t{1} << 24), IoError, ip, ": seq_len ", d.seq_len,
           " is not in [1, 2^24]");
  MT_CHECK(d.vocab > 0 && d.vocab <= (int64_t{1} << 31) - 1, IoError, ip, ": vocab_size ", d.vocab,
           " is not a positive int32");
  for (size_t s = 0; s < d.segments.size(); ++s) {
    int64_t sum = 0;
    for (int64_t len : d.segments[s]) {
      MT_CHECK(len > 0 && len <= d.seq_len, IoError, ip, ": sequence ", s, " has a segment of ",
               len, " tokens (seq_len ", d.seq_len, ")");
      sum += len;
    }
    MT_CHECK(sum == d.seq_len, IoError, ip, ": the segments of sequence ", s, " sum to ", sum,
             ", not seq_len ", d.seq_len);
  }
  const auto L = static_cast<size_t>(d.seq_len);
  for (const auto& sh : index.at("shards")) {
    const fs::path p = fs::path(dir) / sh.at("file").get<std::string>();
    std::string bytes = read_file(p);
    const auto declared = index_integer<size_t>(sh.at("bytes"), ip, "bytes");
    MT_CHECK(bytes.size() == declared, IoError, "shard '", p.string(), "' has ", bytes.size(),
             " bytes, index says ", declared);
    MT_CHECK(cat(std::hex, fnv1a64(bytes.data(), bytes.size())) == sh.at("fnv1a64"), IoError,
             "shard '", p.string(), "' does not match its checksum");
    const auto n = index_integer<size_t>(sh.at("sequences"), ip, "sequences");
    MT_CHECK(n <= d.segments.size() && bytes.size() == n * 2 * L * sizeof(int32_t), IoError,
             "shard '", p.string(), "' has ", bytes.size(), " bytes, not the ", n,
             " sequences x 2 x ", L, " int32 its index entry declares");
    const auto* v = reinterpret_cast<const int32_t*>(bytes.data());
    for (size_t s = 0; s < n; ++s) {
      d.ids.insert(d.ids.end(), v + 2 * s * L, v + (2 * s + 1) * L);
      d.targets.insert(d.targets.end(), v + (2 * s + 1) * L, v + (2 * s + 2) * L);
    }
  }
  MT_CHECK(!d.segments.empty(), IoError, "dataset '", dir, "' holds no sequence");
  MT_CHECK(d.ids.size() == d.segments.size() * L, IoError, "dataset '", dir, "' holds ",
           d.ids.size(), " tokens, index declares ", d.segments.size(), " sequences of ", L);
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::vector<Document> read_corpus(const CorpusOptions& opt, int64_t* skipped) {
  MT_CHECK(!opt.inputs.empty(), ValueError, "no corpus inputs given");
  std::vector<fs::path> files;
  for (const std::string& in : opt.inputs) {
    MT_CHECK(fs::exists(in), IoError, "corpus input '", in, "' does not exist");
    if (fs::is_directory(in)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(in)) {
        if (!e.is_regular_file() || e.is_symlink()) continue;
        const std::string name = e.path().filename().string();
        if (!opt.extension.empty() && (name.size() < opt.extension.size() ||
                                       name.compare(name.size() - opt.extension.size(),
                                                    opt.extension.size(), opt.extension) != 0))
          continue;
        found.push_back(e.path());
      }
      MT_CHECK(!found.empty(), IoError, "corpus directory '", in, "' has no files",
               opt.extension.empty() ? "" : cat(" ending with ", opt.extension));
      std::sort(found.begin(), found.end());  // the same order on every machine
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.emplace_back(in);
    }
  }
  std::vector<Document> docs;
  int64_t bytes = 0, bad = 0;
  for (const fs::path& f : files) {
    if (opt.max_bytes > 0 && bytes >= opt.max_bytes) break;
    std::string text = read_file(f);
    MT_CHECK(!text.empty(), IoError, "corpus file '", f.string(), "' is empty");
    bytes += static_cast<int64_t>(text.size());
    std::vector<Document> got;
    if (is_jsonl(f))
      read_jsonl(f, text, got);
    else
      read_text(f, text, opt.separator, got);
    for (Document& d : got) {
      if (!valid_utf8(d.text) || !valid_utf8(d.prompt)) {
        ++bad;
        continue;
      }
      docs.push_back(std::move(d));
    }
  }
  MT_CHECK(!docs.empty(), IoError, "corpus ", opt.inputs.front(), " holds no usable documents");
  if (skipped) *skipped = bad;
  return docs;
}

void split_corpus(const std::vector<Document>& docs, double heldout_fraction,
                  std::vector<Document>& train, std::vector<Document>& heldout) {
  std::vector<Document> none;
  split_corpus(docs, heldout_fraction, 0, train, heldout, none);
}

void split_corpus(const std::vector<Document>& docs, double validation, double test,
                  std::vector<Document>& train, std::vector<Document>& val,
                  std::vector<Document>& tst) {
  MT_CHECK(validation >= 0 && test >= 0 && validation + test < 1, ValueError, "held-out fractions ",
           validation, " + ", test, " must be in [0, 1)");
  const auto cut_val = static_cast<uint64_t>(validation * 10000.0);
  const auto cut_test = cut_val + static_cast<uint64_t>(test * 10000.0);
  for (const Document& d : docs) {
    const uint64_t b = (fnv1a64(d.source.data(), d.source.size()) >> 16) % 10000;
    (b < cut_val ? val : b < cut_test ? tst : train).push_back(d);
  }
}

int64_t PackedData::target_tokens() const {
  return static_cast<int64_t>(
      std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kIgnoreIndex; }));
}

PackedData pack_documents(const std::vector<Document>& docs, const Tokenizer& tok,
                          int64_t seq_len) {
  MT_CHECK(seq_len > 1, ValueError, "sequence length ", seq_len, " must be > 1");
  PackedData out{.seq_len = seq_len, .vocab = tok.vocab()};
  int64_t fill = 0;  // tokens in the open sequence
  auto open_if_needed = [&] {
    if (fill == 0) out.segments.emplace_back();
  };
  for (const Document& d : docs) {
    // toks[k] is a target when trained[k]: never bos or prompt tokens.
    std::vector<int32_t> toks;
    std::vector<bool> trained;
    if (!d.ids.empty()) {
      toks = d.ids;
      for (size_t k = 0; k < toks.size(); ++k) {
        MT_CHECK(toks[k] < out.vocab, ValueError, d.source, ": input_ids[", k, "] = ", toks[k],
                 " is outside the tokenizer vocabulary [0, ", out.vocab, ")");
        trained.push_back(d.labels[k] != kIgnoreIndex);
      }
    } else {
      if (tok.document_bos() >= 0) toks.push_back(tok.document_bos());
      if (!d.prompt.empty()) {
        std::vector<int32_t> p = tok.encode(d.prompt);
        toks.insert(toks.end(), p.begin(), p.end());
      }
      trained.assign(toks.size(), false);
      std::vector<int32_t> body = tok.encode(d.text);
      toks.insert(toks.end(), body.begin(), body.end());
      toks.push_back(tok.eos());
      trained.resize(toks.size(), true);
    }
    if (toks.size() < 2) continue;
    ++out.documents;
    // Pair i: input toks[i], target toks[i+1] where that token is trained on.
    size_t i = 0;
    const size_t pairs = toks.size() - 1;
    while (i < pairs) {
      open_if_needed();
      const size_t take = std::min(pairs - i, static_cast<size_t>(seq_len - fill));
      for (size_t k = i; k < i + take; ++k) {
        out.ids.push_back(toks[k]);
        out.targets.push_back(trained[k + 1] ? toks[k + 1] : kIgnoreIndex);
      }
      out.segments.back().push_back(static_cast<int64_t>(take));
      fill += static_cast<int64_t>(take);
      i += take;
      if (fill == seq_len) fill = 0;
    }
  }
  MT_CHECK(out.documents > 0, ValueError, "no document produced any tokens");
  if (fill > 0) {  // pad the last sequence with one ignored segment
    out.segments.back().push_back(seq_len - fill);
    for (int64_t k = fill; k < seq_len; ++k) {
      out.ids.push_back(tok.eos());
      out.targets.push_back(kIgnoreIndex);
    }
  }
  return out;
}

void write_dataset(const PackedData& data, const std::string& dir) {
  fs::path tmp = dir + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  nlohmann::json index = {{"format", kFormat},           {"seq_len", data.seq_len},
                          {"vocab_size", data.vocab},    {"sequences", data.sequences()},
                          {"documents", data.documents}, {"target_tokens", data.target_tokens()},
                          {"segments", data.segments}};
  nlohmann::json shards = nlohmann::json::array();
  const auto L = static_cast<size_t>(data.seq_len);
  for (int64_t s0 = 0; s0 < data.sequences(); s0 += kShardSequences) {
    const int64_t n = std::min(kShardSequences, data.sequences() - s0);
    std::vector<int32_t> buf;
    buf.reserve(static_cast<size_t>(n) * 2 * L);
    for (int64_t s = s0; s < s0 + n; ++s) {
      auto off = static_cast<ptrdiff_t>(static_cast<size_t>(s) * L);
      buf.insert(buf.end(), data.ids.begin() + off,
                 data.ids.begin() + off + static_cast<ptrdiff_t>(L));
      buf.insert(buf.end(), data.targets.begin() + off,
                 data.targets.begin() + off + static_cast<ptrdiff_t>(L));
    }
    char name[32];
    std::snprintf(name, sizeof name, "shard_%05lld.bin",
                  static_cast<long long>(s0 / kShardSequences));
    const size_t bytes = buf.size() * sizeof(int32_t);
    write_bytes(tmp / name, buf.data(), bytes);
    shards.push_back({{"file", name},
                      {"sequences", n},
                      {"bytes", bytes},
                      {"fnv1a64", cat(std::hex, fnv1a64(buf.data(), bytes))}});
  }
  index["shards"] = shards;
  if (data.images) write_images(*data.images, tmp.string());
  const std::string text = index.dump();
  write_bytes(tmp / "index.json", text.data(), text.size());
  fs::remove_all(dir);
  fs::rename(tmp, dir);
}

PackedData load_dataset(const std::string& dir) {
  const fs::path ip = fs::path(dir) / "index.json";
  MT_CHECK(fs::is_regular_file(ip), IoError, "dataset '", dir,
           "' has no index.json (run `moetrain data prepare` first)");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_file(ip));
  } catch (const nlohmann::json::exception& e) {
    MT_THROW(IoError, ip.string(), ": ", e.what());
  }
  // A missing key or a value of the wrong type is an IoError naming the file, not a JSON exception.
  PackedData d;
  try {
    MT_CHECK(index.is_object() && index.value("format", "") == kFormat, IoError, ip.string(),
             ": format is not ", kFormat);
    read_index(index, ip.string(), dir, d);
  } catch (const nlohmann::json::exception& e) {
    MT_THROW(IoError, ip.string(), ": ", e.what());
  }
  for (size_t i = 0; i < d.ids.size(); ++i) {
    MT_CHECK(d.ids[i] >= 0 && d.ids[i] < d.vocab, ValueError, "dataset '", dir, "': token id ",
             d.ids[i], " at position ", i, " is outside its vocabulary [0, ", d.vocab, ")");
    MT_CHECK(d.targets[i] == kIgnoreIndex || (d.targets[i] >= 0 && d.targets[i] < d.vocab),
             ValueError, "dataset '", dir, "': target id ", d.targets[i], " at position ", i,
             " is outside its vocabulary [0, ", d.vocab, ")");
  }
  d.images = load_images(dir);
  return d;
}

Batch make_batch(const PackedData& data, const std::vector<int64_t>& indices) {
  MT_CHECK(!indices.empty(), ValueError, "make_batch: a batch needs at least one sequence");
  Batch b;
  std::vector<int64_t> lengths;
  for (int64_t s : indices) {
    MT_CHECK(s >= 0 && s < data.sequences(), ValueError, "sequence ", s, " of ", data.sequences());
    lengths.insert(lengths.end(), data.segments[static_cast<size_t>(s)].begin(),
                   data.segments[static_cast<size_t>(s)].end());
  }
  b.seq = SeqInfo::from_lengths(lengths);
  b.ids = Tensor::empty({b.seq.tokens}, DType::I32);
  b.targets = Tensor::empty({b.seq.tokens}, DType::I32);
  const int64_t L = data.seq_len;
  for (size_t j = 0; j < indices.size(); ++j) {
    const auto off = static_cast<size_t>(indices[j] * L);
    std::copy_n(data.ids.begin() + static_cast<ptrdiff_t>(off), L,
                b.ids.i32() + static_cast<int64_t>(j) * L);
    std::copy_n(data.targets.begin() + static_cast<ptrdiff_t>(off), L,
                b.targets.i32() + static_cast<int64_t>(j) * L);
  }
  for (int64_t t = 0; t < b.seq.tokens; ++t) b.target_tokens += b.targets.i32()[t] != kIgnoreIndex;
  if (data.images) b.images = image_batch(*data.images, indices);
  return b;
}

}  // namespace mt
