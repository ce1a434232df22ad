// Bounded random-mutation fuzzing of the safetensors and config parsers (libFuzzer needs a clang
// build with -fsanitize=fuzzer, which CI's gcc build lacks; this runs everywhere in ctest).
// Every mutated input must either parse or raise an mt::Error: no other exception, no crash,
// no hang. Each test stops after a fixed number of cases or a time budget, whichever first.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/rng.h"
#include "harness/seed.h"
#include "io/hf_config.h"
#include "io/safetensors.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kMaxCases = 4000;
constexpr double kBudgetSeconds = 5.0;

std::string mutate(Rng& rng, std::string s) {
  int edits = 1 + static_cast<int>(rng.below(4));
  for (int e = 0; e < edits; ++e) {
    switch (rng.below(6)) {
      case 0:  // flip a byte
        if (!s.empty())
          s[rng.below(static_cast<int64_t>(s.size()))] ^= static_cast<char>(1 + rng.below(255));
        break;
      case 1:  // truncate
        s.resize(static_cast<size_t>(rng.below(static_cast<int64_t>(s.size()) + 1)));
        break;
      case 2:  // insert random bytes
        s.insert(
            static_cast<size_t>(rng.below(static_cast<int64_t>(s.size()) + 1)),
            std::string(static_cast<size_t>(1 + rng.below(8)), static_cast<char>(rng.below(256))));
        break;
      case 3:  // overwrite with a digit (hits lengths and offsets)
        if (!s.empty())
          s[rng.below(static_cast<int64_t>(s.size()))] = static_cast<char>('0' + rng.below(10));
        break;
      case 4:  // duplicate a slice
        if (s.size() > 2) {
          size_t a = static_cast<size_t>(rng.below(static_cast<int64_t>(s.size())));
          size_t n = static_cast<size_t>(rng.below(static_cast<int64_t>(s.size() - a)));
          s.insert(a, s.substr(a, n));
        }
        break;
      default:  // rewrite the 8-byte length prefix
        if (s.size() >= 8) {
          uint64_t v = rng.below(3) == 0
                           ? rng.next_u64()
                           : static_cast<uint64_t>(rng.below(static_cast<int64_t>(s.size()) + 16));
          for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
        }
    }
  }
  return s;
}

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(SafetensorsFuzz, MutatedFilesRaiseOnlyTypedErrors) {
  const uint64_t seed = test::test_seed();
  fs::path dir = fs::temp_directory_path() / ("mt_fuzz_" + std::to_string(seed));
  fs::create_directories(dir);
  Rng rng(seed);
  TensorMap m;
  m["a"] = Tensor::zeros({3, 4});
  m["b"] = Tensor::zeros({5}, DType::BF16);
  m["c"] = Tensor::zeros({2, 2}, DType::I64);
  m["d"] = Tensor::zeros({0});
  const std::string good_path = (dir / "good.safetensors").string();
  write_safetensors(good_path, m, {{"k", "v"}});
  const std::string good = read_file(good_path);
  const std::string path = (dir / "m.safetensors").string();
  auto start = std::chrono::steady_clock::now();
  int parsed = 0, rejected = 0, cases = 0;
  for (; cases < kMaxCases; ++cases) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kBudgetSeconds)
      break;
    std::string bytes = mutate(rng, good);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    try {
      SafetensorsData d = read_safetensors(path);
      ++parsed;
      // Whatever parsed must be self-consistent and rewritable.
      for (const auto& [name, t] : d.tensors) ASSERT_TRUE(t.numel() == 0 || t.raw()) << name;
      write_safetensors(path, d.tensors, d.metadata);
      ASSERT_EQ(read_safetensors(path).tensors.size(), d.tensors.size());
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "case " << cases << ": untyped exception " << e.what();
    }
  }
  fs::remove_all(dir);
  EXPECT_GT(rejected, 0);
  RecordProperty("cases", cases);
  std::printf("%d cases: %d parsed, %d rejected\n", cases, parsed, rejected);
}

// Random structural edits of valid configs: drop keys, change types and values.
json mutate_json(Rng& rng, json j) {
  const json pool[] = {json(nullptr),
                       json(-1),
                       json(0),
                       json(3),
                       json(1e30),
                       json(2.5),
                       json("sigmoid"),
                       json("x"),
                       json(true),
                       json::array({1, 2}),
                       json::object({{"rope_type", "yarn"}}),
                       json::array({"full_attention"})};
  int edits = 1 + static_cast<int>(rng.below(3));
  for (int e = 0; e < edits && j.is_object() && !j.empty(); ++e) {
    auto it = j.begin();
    std::advance(it, rng.below(static_cast<int64_t>(j.size())));
    std::string key = it.key();
    switch (rng.below(3)) {
      case 0:
        j.erase(key);
        break;
      case 1:
        j[key] = pool[rng.below(std::size(pool))];
        break;
      default:
        if (j[key].is_object())
          j[key] = mutate_json(rng, j[key]);
        else
          j["unknown_" + std::to_string(rng.below(5))] = 1;
    }
  }
  return j;
}

TEST(ConfigFuzz, MutatedConfigsRaiseOnlyTypedErrors) {
  const json seeds[] = {
      json::parse(R"({"model_type": "kimi_linear", "vocab_size": 53, "hidden_size": 16,
        "intermediate_size": 24, "moe_intermediate_size": 8, "num_hidden_layers": 3,
        "num_attention_heads": 2, "kv_lora_rank": 6, "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 2, "v_head_dim": 4, "num_experts": 4, "num_experts_per_token": 2,
        "num_shared_experts": 1, "linear_attn_config": {"kda_layers": [1, 3],
        "full_attn_layers": [2], "head_dim": 4, "num_heads": 2, "short_conv_kernel_size": 3},
        "first_k_dense_replace": 1, "mla_use_nope": true})"),
      json::parse(R"({"model_type": "deepseek_v32", "vocab_size": 41, "hidden_size": 16,
        "intermediate_size": 20, "moe_intermediate_size": 6, "num_hidden_layers": 2,
        "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 6, "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 2, "v_head_dim": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_shared_experts": 0, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
        "index_n_heads": 2, "index_head_dim": 4, "index_topk": 3,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000}})"),
      ModelConfig::load("tiny").to_json()};
  Rng rng(test::test_seed());
  auto start = std::chrono::steady_clock::now();
  int cases = 0, rejected = 0;
  for (; cases < kMaxCases; ++cases) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kBudgetSeconds)
      break;
    json j = mutate_json(rng, seeds[rng.below(3)]);
    try {
      hf_config_from_json(j, "fuzz");
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "untyped exception " << e.what() << " for " << j.dump();
    }
    // The raw text parser too: mutated bytes of the serialised config.
    std::string text = mutate(rng, j.dump());
    json k = json::parse(text, nullptr, false);
    if (k.is_discarded()) continue;
    try {
      hf_config_from_json(k, "fuzz");
    } catch (const Error&) {
    } catch (const std::exception& e) {
      FAIL() << "untyped exception " << e.what() << " for " << text;
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("%d cases, %d rejected\n", cases, rejected);
}

}  // namespace
}  // namespace mt
