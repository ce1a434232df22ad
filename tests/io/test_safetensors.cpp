#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "harness/seed.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory per test, removed afterwards.
class TmpDir {
 public:
  TmpDir() {
    Rng r(static_cast<uint64_t>(::testing::UnitTest::GetInstance()->random_seed()) ^
          reinterpret_cast<uintptr_t>(this));
    path_ = fs::temp_directory_path() /
            ("mt_st_" + std::to_string(::getpid()) + "_" + std::to_string(r.next_u64()));
    fs::create_directories(path_);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Writes a file byte by byte as the format specifies, independently of write_safetensors.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               int64_t declared_len = -1) {
  uint64_t n = declared_len >= 0 ? static_cast<uint64_t>(declared_len) : header.size();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

Tensor random_tensor(Rng& rng, Shape shape, DType dt) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (dt) {
      case DType::F32:
        t.f32()[i] = static_cast<float>(rng.normal());
        break;
      case DType::BF16:
        t.bf16()[i] = f32_to_bf16(static_cast<float>(rng.normal()));
        break;
      case DType::I32:
        t.i32()[i] = static_cast<int32_t>(rng.next_u64());
        break;
      case DType::I64:
        t.i64()[i] = static_cast<int64_t>(rng.next_u64());
        break;
      case DType::F64:
        t.f64()[i] = rng.normal();
        break;
    }
  }
  return t;
}

// Expected value after loading: floats become f32, integers stay.
void expect_loaded_equal(const Tensor& orig, const Tensor& got, const std::string& name) {
  ASSERT_EQ(orig.shape(), got.shape()) << name;
  if (orig.dtype() == DType::BF16) {
    ASSERT_EQ(got.dtype(), DType::F32) << name;
    for (int64_t i = 0; i < orig.numel(); ++i)
      ASSERT_EQ(bf16_to_f32(orig.bf16()[i]), got.f32()[i]) << name << "[" << i << "]";
    return;
  }
  ASSERT_EQ(orig.dtype(), got.dtype()) << name;
  // memcmp's pointers must not be null even for 0 bytes, and an empty tensor has no storage.
  if (orig.bytes() > 0) {
    ASSERT_EQ(0, std::memcmp(orig.raw(), got.raw(), orig.bytes())) << name;
  }
}

TensorMap random_map(Rng& rng) {
  TensorMap m;
  m["a.weight"] = random_tensor(rng, {3 + rng.below(5), 1 + rng.below(7)}, DType::F32);
  m["b.bf16"] = random_tensor(rng, {2, 3, 1 + rng.below(5)}, DType::BF16);
  m["ids"] = random_tensor(rng, {2, 1 + rng.below(9)}, DType::I32);
  m["ids64"] = random_tensor(rng, {1 + rng.below(9)}, DType::I64);
  m["scalar"] = random_tensor(rng, {}, DType::F32);
  m["empty"] = Tensor::empty({0, 4}, DType::F32);
  return m;
}

TEST(Safetensors, RoundTripRandom) {
  TmpDir dir;
  for (int draw = 1; draw <= 5; ++draw) {
    Rng rng(test::test_seed());
    TensorMap m = random_map(rng);
    MetadataMap meta{{"format", "pt"}, {"note", "draw " + std::to_string(draw)}};
    std::string path = dir / "x.safetensors";
    write_safetensors(path, m, meta);
    SafetensorsData d = read_safetensors(path);
    EXPECT_EQ(d.metadata, meta);
    ASSERT_EQ(d.tensors.size(), m.size());
    for (const auto& [name, t] : m) {
      ASSERT_TRUE(d.tensors.count(name)) << name;
      expect_loaded_equal(t, d.tensors.at(name), name);
    }
    // The data section starts 8-byte aligned and has no holes.
    std::ifstream in(path, std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ((8 + n) % 8, 0u);
    uint64_t total = 0;
    for (const auto& e : read_safetensors_header(path)) total += e.end - e.begin;
    EXPECT_EQ(8 + n + total, fs::file_size(path));
  }
  // No temporary file is left next to the target.
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1);
}

TEST(Safetensors, ReadsHandWrittenFloatFormats) {
  TmpDir dir;
  // f16: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal); bf16: 1.0, -3.0; f64: 0.1
  const uint16_t f16[] = {0x3c00, 0xc000, 0x7bff, 0x0001};
  const uint16_t bf16[] = {0x3f80, 0xc040};
  const double f64 = 0.1;
  std::string data(reinterpret_cast<const char*>(f16), 8);
  data.append(reinterpret_cast<const char*>(bf16), 4);
  data.append(reinterpret_cast<const char*>(&f64), 8);
  json h;
  h["h"] = {{"dtype", "F16"}, {"shape", {2, 2}}, {"data_offsets", {0, 8}}};
  h["b"] = {{"dtype", "BF16"}, {"shape", {2}}, {"data_offsets", {8, 12}}};
  h["d"] = {{"dtype", "F64"}, {"shape", {1}}, {"data_offsets", {12, 20}}};
  std::string path = dir / "f.safetensors";
  write_raw(path, h.dump(), data);
  SafetensorsData d = read_safetensors(path);
  const float* hv = d.tensors.at("h").f32();
  EXPECT_EQ(hv[0], 1.0f);
  EXPECT_EQ(hv[1], -2.0f);
  EXPECT_EQ(hv[2], 65504.0f);
  EXPECT_EQ(hv[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(d.tensors.at("b").f32()[0], 1.0f);
  EXPECT_EQ(d.tensors.at("b").f32()[1], -3.0f);
  EXPECT_EQ(d.tensors.at("d").f32()[0], 0.1f);
  EXPECT_EQ(d.tensors.at("h").shape(), Shape({2, 2}));
}

TEST(Safetensors, ShardedRoundTrip) {
  TmpDir dir;
  Rng rng(test::test_seed());
  TensorMap m;
  for (int i = 0; i < 9; ++i)
    m["layer." + std::to_string(i) + ".w"] = random_tensor(rng, {4, 5 + rng.below(4)}, DType::F32);
  write_safetensors_sharded(dir.path().string(), m, {{"format", "pt"}}, 200);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir.path()))
    shards += e.path().extension() == ".safetensors";
  EXPECT_GT(shards, 2);
  SafetensorsData d = read_safetensors_model(dir.path().string());
  ASSERT_EQ(d.tensors.size(), m.size());
  for (const auto& [name, t] : m) expect_loaded_equal(t, d.tensors.at(name), name);

  // A later single-file save replaces the sharded set for the reader.
  TensorMap small{{"only", random_tensor(rng, {3}, DType::F32)}};
  write_safetensors_sharded(dir.path().string(), small);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(read_safetensors_model(dir.path().string()).tensors.size(), 1u);
}

// The streamed writer (exports at model size): units of several tensors of mixed dtypes, data
// laid out in production order (not name order) across shards; it reads back exactly, each unit
// is made exactly twice (shapes, then data) in order, and no temporary file is left.
TEST(Safetensors, StreamedShardsRoundTrip) {
  TmpDir dir;
  Rng rng(test::test_seed());
  std::vector<TensorMap> units(7);
  for (size_t u = 0; u < units.size(); ++u) {
    // Names that sort against the unit order: z... first, a... last.
    const std::string p = std::string(1, static_cast<char>('z' - u)) + ".";
    units[u][p + "w"] = random_tensor(rng, {4, 5 + rng.below(4)}, DType::F32);
    units[u][p + "b"] = random_tensor(rng, {3 + rng.below(4)}, DType::BF16);
    if (u % 3 == 0) units[u][p + "i"] = random_tensor(rng, {2}, DType::I64);
  }
  std::vector<size_t> calls;
  write_safetensors_streamed(
      dir.path().string(), units.size(),
      [&](size_t u) {
        calls.push_back(u);
        std::vector<std::pair<std::string, Tensor>> out;
        for (const auto& [n, t] : units[u]) out.emplace_back(n, t.clone());
        return out;
      },
      {{"format", "pt"}}, 150);
  // Shapes pass, then data pass, each in unit order: never two units needed at once.
  std::vector<size_t> want;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t u = 0; u < units.size(); ++u) want.push_back(u);
  EXPECT_EQ(calls, want);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    shards += e.path().extension() == ".safetensors";
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
  EXPECT_GT(shards, 2);
  SafetensorsData d = read_safetensors_model(dir.path().string());
  size_t n = 0;
  for (const TensorMap& m : units)
    for (const auto& [name, t] : m) {
      ++n;
      ASSERT_TRUE(d.tensors.count(name)) << name;
      expect_loaded_equal(t, d.tensors.at(name), name);
    }
  EXPECT_EQ(d.tensors.size(), n);
}

// Runs f, expects an exception of type E whose message contains every needle.
template <typename E, typename F>
void expect_error(F f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no exception; wanted one mentioning " << *needles.begin();
  } catch (const E& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << e.what() << "' lacks '" << n << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

TEST(Safetensors, BadInputsNameFileAndTensor) {
  TmpDir dir;
  std::string p = dir / "bad.safetensors";
  auto read = [&] { read_safetensors(p); };

  expect_error<IoError>([&] { read_safetensors(dir / "absent.safetensors"); },
                        {"absent.safetensors", "no such file"});

  {
    std::ofstream(p, std::ios::binary) << "abc";
    expect_error<IoError>(read, {"bad.safetensors", "truncated header"});
  }
  write_raw(p, "{}", "", 1000);
  expect_error<IoError>(read, {"bad.safetensors", "header length 1000 beyond file size"});

  write_raw(p, "{\"x\": {\"dtype\": ", "");
  expect_error<IoError>(read, {"bad.safetensors", "malformed JSON"});

  write_raw(p, "[1,2]", "");
  expect_error<IoError>(read, {"bad.safetensors", "not a JSON object"});

  const std::string data(16, '\1');
  auto hdr = [](const std::string& dt, json shape, uint64_t b, uint64_t e) {
    json h;
    h["w"] = {{"dtype", dt}, {"shape", shape}, {"data_offsets", {b, e}}};
    return h.dump();
  };
  write_raw(p, hdr("F32", {4, 2}, 0, 32), data);
  expect_error<IoError>(read, {"bad.safetensors", "'w'", "outside the data section"});

  write_raw(p, hdr("F32", {2}, 12, 8), data);
  expect_error<IoError>(read, {"'w'", "outside"});

  write_raw(p, hdr("Q4", {4}, 0, 16), data);
  expect_error<IoError>(read, {"bad.safetensors", "'w'", "unknown dtype 'Q4'"});

  write_raw(p, hdr("F32", {3}, 0, 16), data);
  expect_error<ShapeError>(read, {"bad.safetensors", "'w'", "[3]", "12 bytes", "16"});

  write_raw(p, hdr("F32", {-3}, 0, 16), data);
  expect_error<IoError>(read, {"'w'", "non-negative"});

  write_raw(p, hdr("BOOL", {16}, 0, 16), data);
  expect_error<IoError>(read, {"'w'", "BOOL", "not supported"});

  {
    json h;
    h["a"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
    h["b"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}};
    write_raw(p, h.dump(), data);
    expect_error<IoError>(read, {"bad.safetensors", "'a'", "'b'", "overlap"});
  }
  {
    json h;
    h["w"] = {{"dtype", "F32"}, {"shape", {2}}};
    write_raw(p, h.dump(), data);
    expect_error<IoError>(read, {"'w'", "data_offsets"});
  }
  {
    json h;
    h["__metadata__"] = {{"k", 3}};
    write_raw(p, h.dump(), data);
    expect_error<IoError>(read, {"__metadata__", "'k'"});
  }
  // An index that lists a tensor its shard lacks, and one that escapes the directory.
  {
    write_safetensors(dir / "s1.safetensors", {{"x", Tensor::zeros({2})}});
    json idx;
    idx["weight_map"] = {{"x", "s1.safetensors"}, {"y", "s1.safetensors"}};
    std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
    expect_error<IoError>([&] { read_safetensors_model(dir.path().string()); },
                          {"s1.safetensors", "'y'", "not in this shard"});
    idx["weight_map"] = {{"x", "../s1.safetensors"}};
    std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
    expect_error<IoError>([&] { read_safetensors_model(dir.path().string()); },
                          {"invalid file", "../s1.safetensors"});
  }
  // Writing into a directory that does not exist fails cleanly.
  expect_error<IoError>(
      [&] {
        write_safetensors(dir / "no/such/dir/x.safetensors", {{"x", Tensor::zeros({1})}});
      },
      {"x.safetensors", "cannot create"});
}

}  // namespace
}  // namespace mt
