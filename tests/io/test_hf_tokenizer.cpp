// HF tokenizers in C++ against the Python libraries: tokenizers trained by
// tools/make_tokenizers.py with `tokenizers` (DeepSeek-V3's and Qwen3's normaliser and
// pre-tokenizer) and tiktoken (Kimi's pattern), and the ids those libraries give for a corpus of
// code, prose, CJK, emoji, combining marks, CRLF, whitespace runs, long digit runs and special
// tokens written in the text (tests/tokenizer/goldens.json). Then the settings read from
// tokenizer_config.json, `data prepare --tokenizer DIR`, chat data (tools/chat_ids.py) against
// transformers' apply_chat_template with the loss on the replies only, and one-line errors for
// bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/hf_tokenizer.h"
#include "train/prepare.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// tests/tokenizer, found walking up from the working directory (ctest runs in build/tests).
fs::path fixtures() {
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); !p.empty(); p = p.parent_path()) {
    if (fs::is_directory(p / "tests" / "tokenizer", ec)) return p / "tests" / "tokenizer";
    if (p == p.parent_path()) break;
  }
  return {};
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mt_hftok_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void expect_goldens(const std::string& family) {
  const fs::path root = fixtures();
  ASSERT_FALSE(root.empty()) << "no tests/tokenizer directory above the working directory";
  const HfTokenizer tok = HfTokenizer::load((root / family).string());
  const json corpus = read_json(root / "corpus.json");
  const json golden = read_json(root / "goldens.json")[family];
  ASSERT_EQ(corpus.size(), golden.size());
  for (size_t i = 0; i < corpus.size(); ++i) {
    const auto text = corpus[i].get<std::string>();
    const auto want = golden[i].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text);
    EXPECT_EQ(got, want) << family << ", corpus[" << i << "]: " << text;
  }
}

TEST(HfTokenizer, DeepSeekV3MatchesTokenizers) {
  expect_goldens("deepseek_v3");
}
TEST(HfTokenizer, Qwen3NfcMatchesTokenizers) {
  expect_goldens("qwen3");
}
TEST(HfTokenizer, KimiTiktokenMatchesTiktoken) {
  expect_goldens("kimi");
}

TEST(HfTokenizer, DecodeInvertsEncodeWithoutNormaliser) {
  const fs::path root = fixtures();
  const json corpus = read_json(root / "corpus.json");
  for (const char* family : {"deepseek_v3", "kimi"}) {
    const HfTokenizer tok = HfTokenizer::load((root / family).string());
    for (const auto& c : corpus) {
      const auto text = c.get<std::string>();
      EXPECT_EQ(tok.decode(tok.encode(text)), text) << family;
    }
  }
}

TEST(HfTokenizer, SpecialTokensFromTokenizerConfig) {
  const fs::path root = fixtures();
  const HfTokenizer ds = HfTokenizer::load((root / "deepseek_v3").string());
  EXPECT_EQ(ds.bos(), 0);
  EXPECT_EQ(ds.eos(), 1);
  EXPECT_TRUE(ds.add_bos());
  EXPECT_EQ(ds.vocab(), 512);
  const HfTokenizer qw = HfTokenizer::load((root / "qwen3").string());
  EXPECT_FALSE(qw.add_bos());
  EXPECT_EQ(qw.eos(), qw.encode("<|im_end|>").at(0));
  const HfTokenizer kimi = HfTokenizer::load((root / "kimi").string());
  EXPECT_EQ(kimi.vocab(), 768 + 256);  // ranks + Kimi's reserved special ids
  EXPECT_EQ(kimi.eos(), 769);          // [EOS] at ranks + 1
  EXPECT_EQ(kimi.encode("<|reserved_token_1000|>"), std::vector<int32_t>{1000});
  EXPECT_FALSE(kimi.add_bos());
}

// Copies a fixture, lets `edit` change its tokenizer.json (or write files), expects a one-line
// ConfigError naming the file and `key`.
template <typename Edit>
void expect_config_error(const std::string& family, const std::string& file, Edit edit,
                         const std::string& key) {
  const fs::path d = temp_dir("bad");
  for (const auto& e : fs::directory_iterator(fixtures() / family))
    fs::copy_file(e.path(), d / e.path().filename());
  edit(d);
  try {
    (void)HfTokenizer::load(d.string());
    ADD_FAILURE() << "no error for " << key;
  } catch (const ConfigError& e) {
    const std::string msg = e.message();
    EXPECT_NE(msg.find((d / file).string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  fs::remove_all(d);
}

void edit_json(const fs::path& p, const std::function<void(json&)>& f) {
  json j = read_json(p);
  f(j);
  std::ofstream(p) << j.dump();
}

TEST(HfTokenizer, UnsupportedSettingsNameFileAndKey) {
  expect_config_error(
      "deepseek_v3", "tokenizer.json",
      [](const fs::path& d) {
        edit_json(d / "tokenizer.json", [](json& j) { j["model"]["type"] = "WordPiece"; });
      },
      "model.type 'WordPiece'");
  expect_config_error(
      "qwen3", "tokenizer.json",
      [](const fs::path& d) {
        edit_json(d / "tokenizer.json",
                  [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Metaspace"; });
      },
      "pre_tokenizer.pretokenizers[0].type 'Metaspace'");
  expect_config_error(
      "qwen3", "tokenizer.json",
      [](const fs::path& d) {
        edit_json(d / "tokenizer.json", [](json& j) { j["normalizer"]["type"] = "Lowercase"; });
      },
      "normalizer.type 'Lowercase'");
  expect_config_error(
      "deepseek_v3", "tokenizer.json",
      [](const fs::path& d) {
        edit_json(d / "tokenizer.json", [](json& j) { j["model"]["merges"][3][1] = "zzzz"; });
      },
      "model.merges[3]");
  expect_config_error(
      "deepseek_v3", "tokenizer.json",
      [](const fs::path& d) {
        edit_json(d / "tokenizer.json", [](json& j) {
          j["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] = "[a-";
        });
      },
      "pre_tokenizer.pretokenizers[1].pattern.Regex");
  expect_config_error(
      "kimi", "tiktoken.model",
      [](const fs::path& d) { std::ofstream(d / "tiktoken.model", std::ios::app) << "@@@ x\n"; },
      "tiktoken.model:769");
  expect_config_error(
      "kimi", "tokenizer_config.json",
      [](const fs::path& d) {
        edit_json(d / "tokenizer_config.json", [](json& j) {
          j["added_tokens_decoder"]["5"] = {{"content", "<x>"}};
        });
      },
      "added_tokens_decoder['5']");
}

TEST(HfTokenizer, InvalidUtf8IsRefused) {
  const HfTokenizer tok = HfTokenizer::load((fixtures() / "qwen3").string());
  EXPECT_THROW(tok.encode(std::string("ab\xff", 3)), ValueError);
}

// `data prepare --tokenizer DIR`: documents start with bos where the model's tokenizer adds it,
// end with eos, and the tokenizer's files travel with the data.
TEST(HfTokenizer, PrepareWithModelTokenizer) {
  const fs::path d = temp_dir("prepare");
  std::ofstream(d / "a.txt") << "Hello world, 数字 12345.\n";
  std::ofstream(d / "b.txt") << "def f(x):\r\n    return x\n";
  const fs::path tokdir = fixtures() / "deepseek_v3";
  PrepareOptions o{.corpus = {.inputs = {(d / "a.txt").string(), (d / "b.txt").string()}},
                   .out = (d / "out").string(),
                   .tokenizer = tokdir.string(),
                   .seq_len = 64,
                   .heldout = 0};
  std::ostringstream log;
  prepare_data(o, log);
  EXPECT_TRUE(fs::exists(d / "out" / "tokenizer" / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(d / "out" / "tokenizer" / "tokenizer_config.json"));
  const PackedData data = load_dataset((d / "out" / "train").string());
  const HfTokenizer tok = HfTokenizer::load(tokdir.string());
  // Each document is bos, its tokens, eos; its pairs are (token i, token i + 1).
  std::vector<int32_t> ids, targets;
  for (const char* t : {"Hello world, 数字 12345.\n", "def f(x):\r\n    return x\n"}) {
    std::vector<int32_t> doc{0};
    for (int32_t id : tok.encode(t)) doc.push_back(id);
    doc.push_back(1);
    ids.insert(ids.end(), doc.begin(), doc.end() - 1);
    targets.insert(targets.end(), doc.begin() + 1, doc.end());
  }
  ASSERT_GE(data.ids.size(), ids.size());
  EXPECT_EQ(std::vector<int32_t>(data.ids.begin(), data.ids.begin() + ids.size()), ids);
  EXPECT_EQ(std::vector<int32_t>(data.targets.begin(), data.targets.begin() + ids.size()), targets);
  fs::remove_all(d);
}

// Conversations through tools/chat_ids.py (tests/tokenizer/chat_<family>.ids.jsonl) and `data
// prepare`: the packed ids are transformers' apply_chat_template ids (chat_goldens.json), and
// the targets that count are exactly the assistant turns, each decoding to the text the template
// renders for it (reply + end-of-turn tokens); everything else is masked.
void expect_chat(const std::string& family) {
  const fs::path root = fixtures(), d = temp_dir("chat_" + family);
  const json gold = read_json(root / "chat_goldens.json")[family];
  PrepareOptions o{.corpus = {.inputs = {(root / ("chat_" + family + ".ids.jsonl")).string()}},
                   .out = (d / "out").string(),
                   .tokenizer = (root / family).string(),
                   .seq_len = 128,
                   .heldout = 0};
  std::ostringstream log;
  prepare_data(o, log);
  const PackedData data = load_dataset((d / "out" / "train").string());
  const HfTokenizer tok = HfTokenizer::load((root / family).string());
  size_t off = 0;
  for (size_t c = 0; c < gold["ids"].size(); ++c) {
    const auto ids = gold["ids"][c].get<std::vector<int32_t>>();
    const auto turns = gold["assistant"][c].get<std::vector<std::string>>();
    ASSERT_LE(off + ids.size() - 1, data.ids.size());
    std::vector<std::string> runs;
    bool open = false;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      EXPECT_EQ(data.ids[off + i], ids[i]) << family << " conversation " << c << " token " << i;
      const int32_t t = data.targets[off + i];
      if (t != kIgnoreIndex) {
        EXPECT_EQ(t, ids[i + 1]);
        if (!open) runs.emplace_back();
        runs.back() += tok.decode({t});
      }
      open = t != kIgnoreIndex;
    }
    EXPECT_EQ(runs, turns) << family << " conversation " << c;
    off += ids.size() - 1;
  }
  fs::remove_all(d);
}

// Tokenized lines are checked before anything is written: labels that are neither the id nor
// -100, a length mismatch, ids beyond the tokenizer, and token ids without --tokenizer.
TEST(HfTokenizer, BadTokenizedLinesNameFileAndLine) {
  const fs::path d = temp_dir("badids");
  auto expect_error = [&](const std::string& line, const std::string& tokenizer,
                          const std::string& needle) {
    std::ofstream(d / "x.jsonl") << "{\"text\": \"fine\"}\n" << line << "\n";
    PrepareOptions o{.corpus = {.inputs = {(d / "x.jsonl").string()}},
                     .out = (d / "out").string(),
                     .tokenizer = tokenizer,
                     .seq_len = 16,
                     .heldout = 0};
    std::ostringstream log;
    try {
      prepare_data(o, log);
      ADD_FAILURE() << "no error for " << line;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
    EXPECT_FALSE(fs::exists(d / "out" / "train")) << line;
  };
  const std::string tok = (fixtures() / "deepseek_v3").string();
  expect_error(R"({"input_ids": [5, 6, 7], "labels": [-100, 6, 8]})", tok, "x.jsonl:2: labels[2]");
  expect_error(R"({"input_ids": [5, 6, 7], "labels": [-100, 6]})", tok, "x.jsonl:2: 3 input_ids");
  expect_error(R"({"input_ids": [5, 6, 7]})", tok, "x.jsonl:2: input_ids without labels");
  expect_error(R"({"input_ids": [5, 600], "labels": [5, 600]})", tok, "x.jsonl:2: input_ids[1]");
  expect_error(R"({"input_ids": [5, 6], "labels": [5, 6]})", "", "give the --tokenizer");
  fs::remove_all(d);
}

TEST(HfTokenizer, ChatTemplateDeepSeekV3) {
  expect_chat("deepseek_v3");
}
TEST(HfTokenizer, ChatTemplateQwen3) {
  expect_chat("qwen3");
}
TEST(HfTokenizer, ChatTemplateKimi) {
  expect_chat("kimi");
}

}  // namespace
}  // namespace mt
