#include "io/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "core/error.h"

namespace mt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// tokenization_kimi.py's pat_str with each class intersection `[X&&[^\p{Han}]]` (Rust regex
// syntax, which PCRE2 10.42 lacks) written as `(?:(?!\p{Han})[X])`: the same set of characters.
constexpr const char* kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*)"
    R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+)"
    R"((?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// tokenizers' ByteLevel pre-tokenizer with use_regex (GPT-2's pattern).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Kimi's tokenizer reserves this many special ids above the ranks (tokenization_kimi.py).
constexpr int32_t kTiktokenReserved = 256;

// The Rust regex engines behind `tokenizers` (Oniguruma) and tiktoken (fancy-regex) take \s as
// Unicode White_Space; PCRE2's UCP \s lacks U+0085 (NEL), so it is added back, in and out of
// classes. Rewrites \s and \S only; everything else is passed through.
std::string with_white_space(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[++i];
      if (n == 's')
        out += in_class ? R"(\s\x{85})" : R"([\s\x{85}])";
      else if (n == 'S') {
        MT_CHECK(!in_class, ConfigError, "\\S inside a character class is not supported");
        out += R"([^\s\x{85}])";
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a literal ] first
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

// A compiled PCRE2 pattern (UTF, Unicode properties for \d \s \w and POSIX classes).
class Regex {
 public:
  Regex() = default;
  Regex(const std::string& pattern, const std::string& where) {
    const std::string p = with_white_space(pattern);
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (c == nullptr) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      MT_THROW(ConfigError, where, ": pattern does not compile at offset ", off, ": ",
               reinterpret_cast<const char*>(msg.data()));
    }
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT fails
    code_ = std::shared_ptr<pcre2_code>(c, pcre2_code_free);
  }

  // [begin, end) of each leftmost non-overlapping match in s; empty matches are skipped.
  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    size_t start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(),
                                 start, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      MT_CHECK(rc > 0, InternalError, "PCRE2 match failed with code ", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      if (ov[1] > ov[0]) {
        out.emplace_back(ov[0], ov[1]);
        start = ov[1];
      } else {  // step over one whole character
        start = ov[0] + 1;
        while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;
      }
    }
    return out;
  }

 private:
  std::shared_ptr<pcre2_code> code_;
};

// GPT-2's reversible map of bytes to printable characters (bytes_to_unicode): printable Latin-1
// bytes stand for themselves, the rest take code points 256, 257, ... in byte order.
std::array<std::string, 256> byte_chars() {
  std::array<std::string, 256> out;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const int cp = keep ? b : next++;
    std::array<utf8proc_uint8_t, 4> buf{};
    const auto n = utf8proc_encode_char(cp, buf.data());
    out[static_cast<size_t>(b)].assign(reinterpret_cast<const char*>(buf.data()),
                                       static_cast<size_t>(n));
  }
  return out;
}

struct Step {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  Regex re;
  bool removed = false, invert = false;  // Split
  bool add_prefix_space = false;         // ByteLevel
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MT_CHECK(in.good(), IoError, "cannot read '", p.string(), "'");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

json read_json(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    MT_THROW(ConfigError, p.string(), ": not valid JSON: ", e.what());
  }
}

// bos_token / eos_token as tokenizer_config.json writes them: a string, {"content": ...} or null.
std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return {};
}

}  // namespace

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

struct HfTokenizer::Impl {
  enum Model { kBpe, kTiktoken } model = kBpe;
  std::vector<std::string> files;
  std::string where;  // the main file, for messages

  // Shared: tokens matched in the raw text before anything else (content -> id), leftmost-longest.
  std::vector<std::pair<std::string, int32_t>> added;
  std::array<std::vector<size_t>, 256> added_by_byte;  // indices into `added`, longest first
  int utf8proc_options = 0;                            // 0: no normaliser
  std::vector<Step> steps;
  std::vector<std::string> id_to_token;  // BPE: byte-level strings; tiktoken: bytes
  std::vector<bool> is_added;
  int32_t bos = -1, eos = -1;
  bool add_bos = false;

  // tokenizer.json BPE: byte-level vocabulary and merges (pair of ids -> rank, merged id).
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  std::array<int32_t, 256> byte_id{};
  std::array<std::string, 256> byte_char = byte_chars();
  bool ignore_merges = false;

  void index_added() {
    for (auto& v : added_by_byte) v.clear();
    std::vector<size_t> order(added.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return added[a].first.size() > added[b].first.size();
    });
    for (size_t i : order)
      if (!added[i].first.empty())
        added_by_byte[static_cast<unsigned char>(added[i].first[0])].push_back(i);
  }

  void set_token(int32_t id, const std::string& s, bool add) {
    MT_CHECK(id >= 0, ConfigError, where, ": token '", s, "' has a negative id ", id);
    if (static_cast<size_t>(id) >= id_to_token.size()) {
      id_to_token.resize(static_cast<size_t>(id) + 1);
      is_added.resize(static_cast<size_t>(id) + 1, false);
    }
    id_to_token[static_cast<size_t>(id)] = s;
    if (add) is_added[static_cast<size_t>(id)] = true;
  }

  int32_t lookup_added(const std::string& content) const {
    for (const auto& [c, id] : added)
      if (c == content) return id;
    return -1;
  }

  std::string normalize(std::string_view s) const {
    if (utf8proc_options == 0 || s.empty()) return std::string(s);
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            static_cast<utf8proc_ssize_t>(s.size()), &out,
                                            static_cast<utf8proc_option_t>(utf8proc_options));
    MT_CHECK(n >= 0, ValueError, "normalisation failed: ", utf8proc_errmsg(n));
    std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
  }

  std::vector<std::string> pre_tokenize(std::string s) const {
    std::vector<std::string> pieces{std::move(s)};
    for (const Step& st : steps) {
      std::vector<std::string> next;
      for (const std::string& p : pieces) {
        if (st.kind == Step::kByteLevel && st.add_prefix_space) {
          next.push_back(p.empty() || p[0] == ' ' ? p : " " + p);
          continue;
        }
        if (st.kind == Step::kByteLevel) {
          next.push_back(p);
          continue;
        }
        size_t at = 0;
        auto emit = [&](size_t b, size_t e, bool is_match) {
          if (e <= b) return;
          if (st.removed && (is_match != st.invert)) return;
          next.push_back(p.substr(b, e - b));
        };
        for (auto [b, e] : st.re.matches(p)) {
          emit(at, b, false);
          emit(b, e, true);
          at = e;
        }
        emit(at, p.size(), false);
      }
      pieces = std::move(next);
    }
    return pieces;
  }

  // Byte-level BPE as `tokenizers` applies merges: repeatedly the pair of lowest merge rank,
  // leftmost among equals.
  void bpe(const std::string& piece, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      std::string mapped;
      for (char c : piece) mapped += byte_char[static_cast<unsigned char>(c)];
      if (auto it = vocab.find(mapped); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> sym;
    for (char c : piece) {
      const int32_t id = byte_id[static_cast<unsigned char>(c)];
      if (id >= 0) sym.push_back(id);  // no unk token: `tokenizers` drops the byte too
    }
    while (sym.size() > 1) {
      int32_t best_rank = std::numeric_limits<int32_t>::max(), best_id = -1;
      size_t best = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(sym[i])) << 32) |
                              static_cast<uint32_t>(sym[i + 1]));
        if (it != merges.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          best_id = it->second.second;
          best = i;
        }
      }
      if (best_id < 0) break;
      sym[best] = best_id;
      sym.erase(sym.begin() + static_cast<ptrdiff_t>(best) + 1);
    }
    out.insert(out.end(), sym.begin(), sym.end());
  }

  // tiktoken's byte_pair_merge: parts merge while some adjacent pair's bytes have a rank, the
  // lowest rank first, leftmost among equals.
  void tiktoken_bpe(const std::string& piece, std::vector<int32_t>& out) const {
    if (auto it = vocab.find(piece); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
    std::vector<size_t> cut(piece.size() + 1);
    for (size_t i = 0; i < cut.size(); ++i) cut[i] = i;
    auto rank = [&](size_t i) {
      auto it = vocab.find(piece.substr(cut[i], cut[i + 2] - cut[i]));
      return it == vocab.end() ? std::numeric_limits<int32_t>::max() : it->second;
    };
    while (cut.size() > 2) {
      int32_t best_rank = std::numeric_limits<int32_t>::max();
      size_t best = 0;
      for (size_t i = 0; i + 2 < cut.size(); ++i) {
        const int32_t r = rank(i);
        if (r < best_rank) {
          best_rank = r;
          best = i;
        }
      }
      if (best_rank == std::numeric_limits<int32_t>::max()) break;
      cut.erase(cut.begin() + static_cast<ptrdiff_t>(best) + 1);
    }
    for (size_t i = 0; i + 1 < cut.size(); ++i)
      out.push_back(vocab.at(piece.substr(cut[i], cut[i + 1] - cut[i])));
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    for (const std::string& p : pre_tokenize(normalize(text))) {
      if (model == kBpe)
        bpe(p, out);
      else
        tiktoken_bpe(p, out);
    }
  }

  void load_tokenizer_json(const fs::path& path);
  void load_tiktoken(const fs::path& path, const fs::path& config);
  void read_config(const fs::path& config);
};

void HfTokenizer::Impl::load_tokenizer_json(const fs::path& path) {
  where = path.string();
  const json j = read_json(path);
  auto need = [&](bool ok, const std::string& key, const std::string& what) {
    MT_CHECK(ok, ConfigError, where, ": ", key, " ", what);
  };
  need(j.is_object() && j.contains("model") && j["model"].is_object(), "model", "is missing");
  const json& m = j["model"];
  const std::string type = m.value("type", std::string("BPE"));
  need(type == "BPE", "model.type", cat("'", type, "' is not supported (BPE only)"));
  for (const char* k : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"})
    need(!m.contains(k) || m[k].is_null(), cat("model.", k), "is not supported (must be null)");
  need(!m.value("byte_fallback", false), "model.byte_fallback", "is not supported (must be false)");
  ignore_merges = m.value("ignore_merges", false);
  need(m.contains("vocab") && m["vocab"].is_object(), "model.vocab", "is missing");
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    need(it.value().is_number_integer(), cat("model.vocab['", it.key(), "']"), "is not an id");
    const auto id = it.value().get<int32_t>();
    vocab[it.key()] = id;
    set_token(id, it.key(), false);
  }
  need(m.contains("merges") && m["merges"].is_array(), "model.merges", "is missing");
  int32_t rank = 0;
  for (const json& mg : m["merges"]) {
    std::string a, b;
    if (mg.is_string()) {  // "a b" (tokenizers < 0.20)
      const auto s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      need(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
           cat("model.merges[", rank, "]"), cat("'", s, "' is not two tokens"));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      need(mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string(),
           cat("model.merges[", rank, "]"), "is not a pair of strings");
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    }
    auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    need(ia != vocab.end() && ib != vocab.end() && ic != vocab.end(),
         cat("model.merges[", rank, "]"), cat("'", a, " ", b, "' uses a token not in the vocab"));
    merges.emplace((static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                       static_cast<uint32_t>(ib->second),
                   std::make_pair(rank, ic->second));
    ++rank;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_char[static_cast<size_t>(b)]);
    byte_id[static_cast<size_t>(b)] = it == vocab.end() ? -1 : it->second;
  }

  // Normaliser: Unicode normal forms, alone or in a Sequence.
  std::function<void(const json&, const std::string&)> add_norm = [&](const json& n,
                                                                      const std::string& key) {
    if (n.is_null()) return;
    const std::string t = n.value("type", std::string());
    if (t == "Sequence") {
      for (size_t i = 0; i < n.value("normalizers", json::array()).size(); ++i)
        add_norm(n["normalizers"][i], cat(key, ".normalizers[", i, "]"));
      return;
    }
    int opt = UTF8PROC_STABLE;
    if (t == "NFC")
      opt |= UTF8PROC_COMPOSE;
    else if (t == "NFD")
      opt |= UTF8PROC_DECOMPOSE;
    else if (t == "NFKC")
      opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (t == "NFKD")
      opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else
      need(false, key + ".type",
           cat("'", t, "' is not supported (NFC, NFD, NFKC, NFKD, Sequence)"));
    need(utf8proc_options == 0, key, "is a second Unicode normal form");
    utf8proc_options = opt;
  };
  if (j.contains("normalizer")) add_norm(j["normalizer"], "normalizer");

  // Pre-tokenizer: Split (regex or string, Isolated or Removed) and ByteLevel, in sequence.
  bool byte_level = false;
  std::function<void(const json&, const std::string&)> add_pre = [&](const json& p,
                                                                     const std::string& key) {
    if (p.is_null()) return;
    const std::string t = p.value("type", std::string());
    if (t == "Sequence") {
      const json& list = p.value("pretokenizers", json::array());
      for (size_t i = 0; i < list.size(); ++i)
        add_pre(list[i], cat(key, ".pretokenizers[", i, "]"));
      return;
    }
    Step st;
    if (t == "ByteLevel") {
      st.kind = Step::kByteLevel;
      st.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) {
        Step split;
        split.re = Regex(kGpt2Pattern, where);
        if (st.add_prefix_space) steps.push_back(st);
        steps.push_back(std::move(split));
        byte_level = true;
        return;
      }
      byte_level = true;
    } else if (t == "Split") {
      const json& pat = p.value("pattern", json::object());
      if (pat.contains("Regex") && pat["Regex"].is_string()) {
        st.re = Regex(pat["Regex"].get<std::string>(), cat(where, ": ", key, ".pattern.Regex"));
      } else {
        need(pat.contains("String") && pat["String"].is_string(), key + ".pattern",
             "needs Regex or String");
        std::string lit;
        for (char c : pat["String"].get<std::string>()) {
          if (!std::isalnum(static_cast<unsigned char>(c))) lit += '\\';
          lit += c;
        }
        st.re = Regex(lit, cat(where, ": ", key, ".pattern.String"));
      }
      const std::string beh = p.value("behavior", std::string("Isolated"));
      need(beh == "Isolated" || beh == "Removed", key + ".behavior",
           cat("'", beh, "' is not supported (Isolated, Removed)"));
      st.removed = beh == "Removed";
      st.invert = p.value("invert", false);
    } else {
      need(false, key + ".type", cat("'", t, "' is not supported (Split, ByteLevel, Sequence)"));
    }
    need(!byte_level || st.kind == Step::kByteLevel, key,
         "follows ByteLevel (the byte mapping must come last)");
    if (st.kind == Step::kSplit || st.add_prefix_space) steps.push_back(std::move(st));
  };
  need(j.contains("pre_tokenizer"), "pre_tokenizer", "is missing");
  add_pre(j["pre_tokenizer"], "pre_tokenizer");
  need(byte_level, "pre_tokenizer", "has no ByteLevel step (only byte-level BPE is supported)");

  for (size_t i = 0; i < j.value("added_tokens", json::array()).size(); ++i) {
    const json& a = j["added_tokens"][i];
    const std::string key = cat("added_tokens[", i, "]");
    need(a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
             a["content"].is_string(),
         key, "needs id and content");
    for (const char* k : {"single_word", "lstrip", "rstrip"})
      need(!a.value(k, false), cat(key, ".", k), "is not supported (must be false)");
    const auto id = a["id"].get<int32_t>();
    added.emplace_back(a["content"].get<std::string>(), id);
    set_token(id, added.back().first, true);
  }
  // A TemplateProcessing post-processor that starts with a special token adds bos.
  const json& post = j.value("post_processor", json());
  if (post.is_object() && post.value("type", std::string()) == "TemplateProcessing" &&
      post.contains("single") && post["single"].is_array() && !post["single"].empty() &&
      post["single"][0].contains("SpecialToken")) {
    const std::string tok = post["single"][0]["SpecialToken"].value("id", std::string());
    bos = lookup_added(tok);
    add_bos = bos >= 0;
  }
}

void HfTokenizer::Impl::load_tiktoken(const fs::path& path, const fs::path& config) {
  model = kTiktoken;
  where = path.string();
  const std::string text = read_text(path);
  size_t pos = 0;
  int64_t line = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    const std::string l = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (l.empty()) continue;
    const size_t sp = l.find(' ');
    std::string bytes;
    bool ok = sp != std::string::npos && sp > 0;
    if (ok) {  // base64, padded
      uint32_t acc = 0;
      int bits = 0;
      for (size_t i = 0; i < sp && ok; ++i) {
        const char c = l[i];
        int v = c >= 'A' && c <= 'Z'   ? c - 'A'
                : c >= 'a' && c <= 'z' ? c - 'a' + 26
                : c >= '0' && c <= '9' ? c - '0' + 52
                : c == '+'             ? 62
                : c == '/'             ? 63
                : c == '='             ? -2
                                       : -1;
        if (v == -2) break;
        ok = v >= 0;
        acc = (acc << 6) | static_cast<uint32_t>(std::max(v, 0));
        bits += 6;
        if (bits >= 8) {
          bits -= 8;
          bytes += static_cast<char>((acc >> bits) & 0xFF);
        }
      }
    }
    int64_t rank = -1;
    if (ok) {
      try {
        size_t used = 0;
        rank = std::stoll(l.substr(sp + 1), &used);
        ok = used == l.size() - sp - 1 && rank >= 0 && rank < std::numeric_limits<int32_t>::max();
      } catch (const std::exception&) {
        ok = false;
      }
    }
    MT_CHECK(ok && !bytes.empty(), ConfigError, where, ":", line,
             ": expected '<base64 token> <rank>'");
    MT_CHECK(vocab.emplace(bytes, static_cast<int32_t>(rank)).second, ConfigError, where, ":", line,
             ": token listed twice");
    set_token(static_cast<int32_t>(rank), bytes, false);
  }
  const auto n = static_cast<int32_t>(id_to_token.size());
  MT_CHECK(static_cast<size_t>(n) == vocab.size(), ConfigError, where,
           ": ranks are not dense over 0..", vocab.size() - 1);
  for (int b = 0; b < 256; ++b)
    MT_CHECK(vocab.count(std::string(1, static_cast<char>(b))), ConfigError, where, ": byte ", b,
             " has no rank (every single byte must)");
  steps.push_back({.kind = Step::kSplit, .re = Regex(kKimiPattern, where)});
  std::vector<std::string> special(kTiktokenReserved);
  for (int32_t i = 0; i < kTiktokenReserved; ++i)
    special[static_cast<size_t>(i)] = cat("<|reserved_token_", n + i, "|>");
  if (fs::exists(config)) {
    const json c = read_json(config);
    const json& dec = c.value("added_tokens_decoder", json::object());
    for (auto it = dec.begin(); it != dec.end(); ++it) {
      int64_t id = -1;
      try {
        id = std::stoll(it.key());
      } catch (const std::exception&) {
      }
      MT_CHECK(id >= n && id < n + kTiktokenReserved, ConfigError, config.string(),
               ": added_tokens_decoder['", it.key(), "'] is outside the reserved ids [", n, ", ",
               n + kTiktokenReserved, ")");
      const std::string content = token_content(it.value());
      MT_CHECK(!content.empty(), ConfigError, config.string(), ": added_tokens_decoder['", it.key(),
               "'].content is missing");
      special[static_cast<size_t>(id - n)] = content;
    }
  }
  for (int32_t i = 0; i < kTiktokenReserved; ++i) {
    added.emplace_back(special[static_cast<size_t>(i)], n + i);
    set_token(n + i, special[static_cast<size_t>(i)], true);
  }
}

void HfTokenizer::Impl::read_config(const fs::path& config) {
  if (!fs::exists(config)) return;
  const json c = read_json(config);
  auto id_of = [&](const char* key) {
    if (!c.contains(key) || c[key].is_null()) return -1;
    const std::string content = token_content(c[key]);
    int32_t id = lookup_added(content);
    if (id < 0 && vocab.count(content)) id = vocab.at(content);
    MT_CHECK(id >= 0, ConfigError, config.string(), ": ", key, " '", content,
             "' is not a token of the tokenizer");
    return id;
  };
  if (const int32_t b = id_of("bos_token"); b >= 0) bos = b;
  eos = id_of("eos_token");
  if (c.contains("add_bos_token")) {
    MT_CHECK(c["add_bos_token"].is_boolean(), ConfigError, config.string(),
             ": add_bos_token must be true or false");
    add_bos = c["add_bos_token"].get<bool>();
    MT_CHECK(!add_bos || bos >= 0, ConfigError, config.string(),
             ": add_bos_token is true but there is no bos_token");
  }
}

HfTokenizer::HfTokenizer() : impl_(std::make_unique<Impl>()) {}
HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

bool HfTokenizer::present(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "tokenizer.json") ||
         fs::is_regular_file(fs::path(dir) / "tiktoken.model");
}

HfTokenizer HfTokenizer::load(const std::string& dir) {
  const fs::path d(dir), tj = d / "tokenizer.json", tk = d / "tiktoken.model",
                         cfg = d / "tokenizer_config.json";
  MT_CHECK(present(dir), IoError, "'", dir, "' has neither tokenizer.json nor tiktoken.model");
  HfTokenizer t;
  Impl& m = *t.impl_;
  if (fs::is_regular_file(tj)) {
    m.load_tokenizer_json(tj);
    m.files.push_back(tj.string());
  } else {
    m.load_tiktoken(tk, cfg);
    m.files.push_back(tk.string());
  }
  m.read_config(cfg);
  if (fs::exists(cfg)) m.files.push_back(cfg.string());
  m.index_added();
  return t;
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text) const {
  MT_CHECK(valid_utf8(text), ValueError, "text to tokenize is not valid UTF-8");
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  size_t plain = 0, i = 0;
  while (i < text.size()) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (size_t k : m.added_by_byte[static_cast<unsigned char>(text[i])]) {
      const std::string& c = m.added[k].first;
      if (text.compare(i, c.size(), c) == 0) {
        hit = &m.added[k];
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    m.encode_plain(std::string_view(text).substr(plain, i - plain), out);
    out.push_back(hit->second);
    i += hit->first.size();
    plain = i;
  }
  m.encode_plain(std::string_view(text).substr(plain), out);
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::unordered_map<std::string, char> unmap;
  if (m.model == Impl::kBpe)
    for (int b = 0; b < 256; ++b) unmap[m.byte_char[static_cast<size_t>(b)]] = static_cast<char>(b);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    MT_CHECK(id >= 0 && static_cast<size_t>(id) < m.id_to_token.size(), ValueError, "token id ", id,
             " at position ", i, " is outside the tokenizer vocabulary [0, ", vocab(), ")");
    const std::string& s = m.id_to_token[static_cast<size_t>(id)];
    if (m.model == Impl::kTiktoken || m.is_added[static_cast<size_t>(id)]) {
      out += s;
      continue;
    }
    for (size_t k = 0; k < s.size();) {  // one byte-level character at a time
      const auto c = static_cast<unsigned char>(s[k]);
      const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      auto it = unmap.find(s.substr(k, len));
      if (it != unmap.end())
        out += it->second;
      else
        out += s.substr(k, len);
      k += len;
    }
  }
  return out;
}

int64_t HfTokenizer::vocab() const {
  return static_cast<int64_t>(impl_->id_to_token.size());
}
int32_t HfTokenizer::bos() const {
  return impl_->bos;
}
int32_t HfTokenizer::eos() const {
  return impl_->eos;
}
bool HfTokenizer::add_bos() const {
  return impl_->add_bos;
}
const std::vector<std::string>& HfTokenizer::files() const {
  return impl_->files;
}

}  // namespace mt
