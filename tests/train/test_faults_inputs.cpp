// Integers read from a token dataset's index.json, the image-data files and a sharded
// checkpoint's index.json and state.json (docs/reliability.md, "Inputs"): a float beyond the type
// (undefined behaviour in nlohmann's cast), a fraction (truncated) or an unsigned beyond int64
// (wrapped) is an IoError naming the file and the key, at every call site; a well-formed file still
// loads exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "harness/seed.h"
#include "harness/train_files.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/dataset.h"
#include "train/dist_executor.h"
#include "train/files.h"
#include "train/image_data.h"

namespace fs = std::filesystem;
using namespace mt;
using nlohmann::json;

namespace {

// Numbers no integer key may take: out of every integer type's range (1e30, 2^64 as a float),
// a fraction, an unsigned that int64 would wrap, a negative where the type is unsigned.
const char* kBadAlways[] = {"1e30", "-1e300", "2.5", "18446744073709551616.0"};

json read_json(const fs::path& p) {
  return json::parse(read_file(p));
}
void write_json(const fs::path& p, const json& j) {
  std::ofstream(p) << j.dump();
}

// `f` raises an IoError whose message names `file` and `key`; anything else fails.
template <typename F>
void expect_names(F&& f, const std::string& file, const std::string& key, const std::string& v) {
  try {
    f();
    ADD_FAILURE() << file << ": " << key << " = " << v << " was accepted";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find(file), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(key), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("not an integer in range"), std::string::npos) << e.message();
  }
}

}  // namespace

TEST(FaultsInputs, ImageDataIntegersOutOfRangeOrFractionalAreIoErrors) {
  SCOPED_TRACE(test::seed_note());
  std::mt19937_64 gen(test::test_seed());
  const fs::path dir = test::temp_dir("image_ints");
  PackedImages images;
  images.patch_dim = 3 + static_cast<int64_t>(gen() % 5);
  int64_t patches = 0;
  for (int64_t s = 0; s < 3; ++s) {
    const int64_t rows = 1 + static_cast<int64_t>(gen() % 3),
                  cols = 1 + static_cast<int64_t>(gen() % 3);
    images.images.push_back({s, rows, cols, patches});
    patches += rows * cols;
  }
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < patches * images.patch_dim; ++i) images.pixels.push_back(nd(gen));
  write_images(images, dir.string());
  const fs::path jp = dir / "images.json";
  const json good = read_json(jp);
  {
    auto back = load_images(dir.string());
    ASSERT_TRUE(back);
    EXPECT_EQ(back->patch_dim, images.patch_dim);
    ASSERT_EQ(back->images.size(), images.images.size());
    for (size_t i = 0; i < images.images.size(); ++i)
      EXPECT_EQ(back->images[i].rows * back->images[i].cols,
                images.images[i].rows * images.images[i].cols);
    EXPECT_EQ(back->pixels, images.pixels);
  }
  // Every integer load_images reads, each with every bad value; `bytes` is a size_t (-1 too).
  std::vector<std::pair<std::string, std::string>> sites = {{"/patch_dim", "patch_dim"},
                                                            {"/bytes", "bytes"}};
  for (size_t i = 0; i < images.images.size(); ++i)
    for (size_t k = 0; k < 4; ++k)
      sites.push_back({"/images/" + std::to_string(i) + "/" + std::to_string(k),
                       "images[" + std::to_string(i) + "]"});
  for (const auto& [ptr, key] : sites) {
    std::vector<std::string> bad(std::begin(kBadAlways), std::end(kBadAlways));
    bad.push_back(key == "bytes" ? "-1" : "9223372036854775808");
    for (const std::string& v : bad) {
      SCOPED_TRACE(ptr + " = " + v);
      json j = good;
      j[json::json_pointer(ptr)] = json::parse(v);
      write_json(jp, j);
      expect_names([&] { load_images(dir.string()); }, "images.json", "'" + key + "'", v);
    }
  }
  // A document's image placeholders: an unsigned beyond int64 used to wrap to a negative count.
  const fs::path doc = dir / "docs.jsonl";
  std::ofstream(doc) << R"({"content": [{"image": "a.png", "placeholders": 9223372036854775808}]})"
                     << "\n";
  expect_names([&] { read_interleaved(doc.string()); }, "docs.jsonl:1", "'placeholders'", "2^63");
  fs::remove_all(dir);
}

TEST(FaultsInputs, ShardedCheckpointIntegersOutOfRangeOrFractionalAreIoErrors) {
  SCOPED_TRACE(test::seed_note());
  std::mt19937_64 gen(test::test_seed());
  const fs::path root = test::temp_dir("sharded_ints");
  Model saved(ModelConfig::load("tiny"), gen());
  AdamW opt(saved.params(), {});
  for (size_t i = 0; i < opt.first_moments().size(); ++i) {
    std::normal_distribution<float> nd;
    for (int64_t k = 0; k < opt.first_moments()[i].numel(); ++k) {
      opt.first_moments()[i].f32()[k] = nd(gen);
      opt.second_moments()[i].f32()[k] = std::abs(nd(gen));
    }
  }
  opt.set_steps(1 + static_cast<int64_t>(gen() % 100));
  const TrainState st{.step = 1 + static_cast<int64_t>(gen() % 1000),
                      .data_cursor = static_cast<int64_t>(gen() % 100000),
                      .rng_seed = gen(),
                      .rng_counter = gen()};
  // A one-process checkpoint made sharded: index.json names every tensor as one piece of its
  // file, the manifest re-checksummed (as a mesh save's rank 0 writes it).
  const fs::path dir = save_checkpoint(root.string(), saved, &opt, st, "job");
  json index = {{"format", "moetrain-sharded-1"}, {"world", 1}, {"ep", 1}, {"tensors", {}}};
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    for (const SafetensorsEntry& e : read_safetensors_header((dir / f).string())) {
      int64_t n = 1;
      for (int64_t x : e.shape) n *= x;
      index["tensors"][e.name]["pieces"].push_back(
          {{"file", f}, {"key", e.name}, {"begin", 0}, {"end", n}});
    }
  auto write_dir = [&](const json& idx, const json& state) {
    write_json(dir / "index.json", idx);
    write_json(dir / "state.json", state);
    json files = json::object();
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename() != "manifest.json")
        files[e.path().filename().string()] = {{"fnv1a64", file_checksum(e.path())}};
    write_json(dir / "manifest.json", json{{"files", files}});
  };
  const json state = read_json(dir / "state.json");
  write_dir(index, state);
  ASSERT_TRUE(is_sharded_checkpoint(dir.string()));
  {
    Model m(ModelConfig::load("tiny"), gen());
    AdamW o(m.params(), {});
    const TrainState got = load_sharded_checkpoint(dir.string(), m, &o);
    EXPECT_EQ(got.step, st.step);
    EXPECT_EQ(got.data_cursor, st.data_cursor);
    EXPECT_EQ(got.rng_seed, st.rng_seed);
    EXPECT_EQ(got.rng_counter, st.rng_counter);
    EXPECT_EQ(o.steps(), opt.steps());
    const auto &a = saved.params().all(), &b = m.params().all();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(0, std::memcmp(a[i]->value.f32(), b[i]->value.f32(),
                               static_cast<size_t>(a[i]->value.numel()) * sizeof(float)))
          << a[i]->name;
  }
  auto load = [&] {
    Model m(ModelConfig::load("tiny"), 1);
    AdamW o(m.params(), {});
    load_sharded_checkpoint(dir.string(), m, &o);
  };
  // Every integer of state.json; the uint64 keys also with -1, the int64 keys with 2^63.
  for (const char* key : {"step", "data_cursor", "rng_seed", "rng_counter", "optimizer_steps"}) {
    std::vector<std::string> bad(std::begin(kBadAlways), std::end(kBadAlways));
    const bool u = std::string(key).rfind("rng_", 0) == 0;
    bad.push_back(u ? "-1" : "9223372036854775808");
    for (const std::string& v : bad) {
      SCOPED_TRACE(std::string(key) + " = " + v);
      json s = state;
      s[key] = json::parse(v);
      write_dir(index, s);
      expect_names(load, "state.json", std::string("key '") + key + "'", v);
    }
  }
  // A piece's begin and end in index.json.
  const std::string first = index["tensors"].begin().key();
  for (const char* key : {"begin", "end"})
    for (const std::string v : {"1e30", "-1e300", "2.5", "9223372036854775808"}) {
      SCOPED_TRACE(std::string(key) + " = " + v);
      json idx = index;
      idx["tensors"][first]["pieces"][0][key] = json::parse(v);
      write_dir(idx, state);
      expect_names(load, "index.json", std::string("key '") + key + "'", v);
    }
  fs::remove_all(root);
}

TEST(FaultsInputs, DatasetIndexIntegersOutOfRangeOrFractionalAreIoErrors) {
  SCOPED_TRACE(test::seed_note());
  std::mt19937_64 gen(test::test_seed());
  const fs::path dir = test::temp_dir("dataset_ints") / "train";
  test::write_tiny_dataset(dir, gen(), 3 + static_cast<int>(gen() % 4));
  const json good = read_json(dir / "index.json");
  const PackedData loaded = load_dataset(dir.string());
  EXPECT_EQ(loaded.seq_len, good.at("seq_len").get<int64_t>());
  EXPECT_EQ(loaded.segments.size() * static_cast<size_t>(loaded.seq_len), loaded.ids.size());
  // Every integer load_dataset reads; the size_t keys also with -1, the int64 keys with 2^63.
  const std::vector<std::pair<std::string, std::string>> sites = {
      {"/seq_len", "seq_len"},      {"/vocab_size", "vocab_size"},
      {"/documents", "documents"},  {"/segments/0/0", "segments"},
      {"/shards/0/bytes", "bytes"}, {"/shards/0/sequences", "sequences"}};
  for (const auto& [ptr, key] : sites) {
    std::vector<std::string> bad(std::begin(kBadAlways), std::end(kBadAlways));
    bad.push_back(key == "bytes" || key == "sequences" ? "-1" : "9223372036854775808");
    for (const std::string& v : bad) {
      SCOPED_TRACE(ptr + " = " + v);
      json j = good;
      j[json::json_pointer(ptr)] = json::parse(v);
      write_json(dir / "index.json", j);
      expect_names([&] { load_dataset(dir.string()); }, "index.json", key + " = ", v);
    }
  }
  fs::remove_all(dir.parent_path());
}
