// Tokenizer round trip on real corpora, packing with document boundaries, loss masking of
// prompts, and clear errors for bad inputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "harness/seed.h"
#include "harness/train_files.h"
#include "train/dataset.h"
#include "train/tokenizer.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

using test::temp_dir;

std::vector<Document> sample_corpus() {
  std::vector<Document> docs =
      read_corpus({.inputs = {"/usr/share/games/fortunes/computers"}, .separator = "%"});
  std::vector<Document> code =
      read_corpus({.inputs = {"/usr/lib/python3.11/heapq.py", "/usr/lib/python3.11/bisect.py"}});
  docs.insert(docs.end(), code.begin(), code.end());
  return docs;
}

const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    std::vector<std::string> texts;
    for (const Document& d : sample_corpus()) texts.push_back(d.text);
    return Tokenizer::train(texts, {.vocab = 800});
  }();
  return tok;
}

}  // namespace

TEST(Data, TokenizerRoundTripOnCorpus) {
  const Tokenizer& tok = tokenizer();
  EXPECT_EQ(tok.vocab(), 800);
  int64_t checked = 0, tokens = 0, bytes = 0;
  for (const Document& d : sample_corpus()) {
    std::vector<int32_t> ids = tok.encode(d.text);
    ASSERT_EQ(tok.decode(ids), d.text) << d.source;
    tokens += static_cast<int64_t>(ids.size());
    bytes += static_cast<int64_t>(d.text.size());
    ++checked;
  }
  EXPECT_GT(checked, 100);
  EXPECT_LT(tokens * 2, bytes);  // BPE merges: fewer than one token per two bytes
  // Characters never seen in training still round-trip (byte fallback).
  const std::string odd = "naïve → λx. \t\tx² ✓\n";
  EXPECT_EQ(tok.decode(tok.encode(odd)), odd);
  // Save and load give the same encoding.
  fs::path dir = temp_dir("tok");
  tok.save((dir / "tok.model").string());
  EXPECT_EQ(Tokenizer::load((dir / "tok.model").string()).encode(odd), tok.encode(odd));
  EXPECT_THROW(tok.decode({5, 800}), ValueError);
}

TEST(Data, PackKeepsDocumentsApartAndRoundTrips) {
  const Tokenizer& tok = tokenizer();
  std::vector<Document> docs = sample_corpus();
  docs.resize(40);
  const int64_t L = 61;  // not a divisor of anything in particular
  PackedData p = pack_documents(docs, tok, L);
  // Reassemble each document from the packed stream: ids of its segments plus the last target.
  std::vector<int32_t> stream_ids, stream_tg;
  std::vector<int64_t> seg_len;
  for (int64_t s = 0; s < p.sequences(); ++s) {
    int64_t sum = 0;
    for (int64_t l : p.segments[static_cast<size_t>(s)]) sum += l;
    ASSERT_EQ(sum, L);
  }
  size_t pos = 0, doc = 0;
  std::vector<int32_t> cur;
  for (int64_t s = 0; s < p.sequences() && doc < docs.size(); ++s)
    for (int64_t l : p.segments[static_cast<size_t>(s)]) {
      for (int64_t k = 0; k < l; ++k, ++pos) {
        if (p.targets[pos] == kIgnoreIndex) continue;
        if (cur.empty()) cur.push_back(p.ids[pos]);
        cur.push_back(p.targets[pos]);
        if (k + 1 < l) {
          ASSERT_EQ(p.targets[pos], p.ids[pos + 1]);  // the next token of the same segment
        }
        if (p.targets[pos] == tok.eos()) {
          cur.pop_back();
          ASSERT_EQ(tok.decode(cur), docs[doc].text) << docs[doc].source;
          cur.clear();
          ++doc;
        }
      }
    }
  EXPECT_EQ(doc, docs.size());
  // Disk round trip.
  fs::path dir = temp_dir("pack") / "set";
  write_dataset(p, dir.string());
  PackedData q = load_dataset(dir.string());
  EXPECT_EQ(q.ids, p.ids);
  EXPECT_EQ(q.targets, p.targets);
  EXPECT_EQ(q.segments, p.segments);
  // A batch of sequences 3 and 1 is varlen over their segments.
  Batch b = make_batch(q, {3, 1});
  std::vector<int64_t> want = q.segments[3];
  want.insert(want.end(), q.segments[1].begin(), q.segments[1].end());
  ASSERT_EQ(b.seq.num_seqs, static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(b.seq.offsets[i + 1] - b.seq.offsets[i], want[i]);
  EXPECT_EQ(b.ids.i32()[L], q.ids[static_cast<size_t>(L)]);
}

TEST(Data, PromptTokensAreMaskedFromTheLoss) {
  const Tokenizer& tok = tokenizer();
  fs::path dir = temp_dir("mask");
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"Question: what is a heap?\n", "A tree where parents are smaller."},
      {"Say hi.", "Hello there, computer user!"},
      {"def f(x):", "\n    return x * 2\n"}};
  {
    std::ofstream f(dir / "sft.jsonl");
    for (const auto& [p, r] : pairs)
      f << nlohmann::json{{"prompt", p}, {"response", r}}.dump() << "\n";
  }
  std::vector<Document> docs = read_corpus({.inputs = {(dir / "sft.jsonl").string()}});
  ASSERT_EQ(docs.size(), pairs.size());
  PackedData p = pack_documents(docs, tok, 37);
  // Reference: the counted targets are exactly the response tokens and eos, in order, each
  // predicted from the token before it; every prompt token is masked.
  std::vector<int32_t> want, got;
  int64_t want_masked = 0;
  for (const auto& [pr, re] : pairs) {
    std::vector<int32_t> r = tok.encode(re);
    want.insert(want.end(), r.begin(), r.end());
    want.push_back(tok.eos());
    want_masked += static_cast<int64_t>(tok.encode(pr).size()) - 1;
  }
  int64_t masked = 0;
  for (size_t i = 0; i < p.targets.size(); ++i) {
    if (p.targets[i] != kIgnoreIndex)
      got.push_back(p.targets[i]);
    else if (i < static_cast<size_t>(p.sequences() * 37 - 1) && p.ids[i] != tok.eos())
      ++masked;
  }
  EXPECT_EQ(got, want);
  EXPECT_GE(masked, want_masked);
}

TEST(Data, BadInputsAreClearErrors) {
  fs::path dir = temp_dir("bad");
  try {
    read_corpus({.inputs = {(dir / "missing").string()}});
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("missing"), std::string::npos) << e.message();
  }
  std::ofstream(dir / "empty.txt").close();
  try {
    read_corpus({.inputs = {(dir / "empty.txt").string()}});
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("empty.txt' is empty"), std::string::npos) << e.message();
  }
  std::ofstream(dir / "bad.jsonl") << "{\"text\": \"ok\"}\n{\"txt\": \"typo\"}\n";
  try {
    read_corpus({.inputs = {(dir / "bad.jsonl").string()}});
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("bad.jsonl:2"), std::string::npos) << e.message();
  }
  // A token id beyond the vocabulary is caught when the dataset is loaded.
  PackedData p{.seq_len = 4,
               .vocab = 10,
               .ids = {1, 2, 12, 3},
               .targets = {2, 3, 3, -100},
               .segments = {{4}},
               .documents = 1};
  write_dataset(p, (dir / "set").string());
  try {
    load_dataset((dir / "set").string());
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(e.message().find("token id 12 at position 2"), std::string::npos) << e.message();
  }
}

// The demo's three-way split: each document lands in exactly one split, validation is the
// held-out side of the two-way split (the split the demo's choices were tuned on), the shares
// follow the fractions, and a document's side depends on its name alone.
TEST(Data, ThreeWaySplitKeepsTheTwoWayHeldOutSplitAsValidation) {
  std::mt19937_64 rng(test::test_seed());
  std::vector<Document> docs;
  for (int i = 0; i < 20000; ++i)
    docs.push_back({.text = "x", .source = "doc" + std::to_string(rng()) + ".py"});
  std::vector<Document> train, val, tst, train2, held2;
  split_corpus(docs, 0.1, 0.15, train, val, tst);
  split_corpus(docs, 0.1, train2, held2);
  ASSERT_EQ(train.size() + val.size() + tst.size(), docs.size()) << test::seed_note();
  auto names = [](const std::vector<Document>& d) {
    std::set<std::string> s;
    for (const Document& x : d) s.insert(x.source);
    return s;
  };
  EXPECT_EQ(names(val), names(held2)) << test::seed_note();
  std::set<std::string> all = names(train);
  for (const auto* part : {&val, &tst})
    for (const Document& d : *part) EXPECT_TRUE(all.insert(d.source).second) << d.source;
  // Binomial shares: 20000 draws, 5 standard deviations is under 1.2 points.
  EXPECT_NEAR(static_cast<double>(val.size()) / 20000, 0.10, 0.012) << test::seed_note();
  EXPECT_NEAR(static_cast<double>(tst.size()) / 20000, 0.15, 0.013) << test::seed_note();
  // Reversed input order: the same documents on each side.
  std::vector<Document> rev(docs.rbegin(), docs.rend()), train3, val3, tst3;
  split_corpus(rev, 0.1, 0.15, train3, val3, tst3);
  EXPECT_EQ(names(val3), names(val));
  EXPECT_EQ(names(tst3), names(tst));
  try {
    split_corpus(docs, 0.6, 0.4, train3, val3, tst3);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(e.message().find("0.6 + 0.4"), std::string::npos) << e.message();
  }
}
