// Loading HF model directories as shipped: FP8 block dequantisation against PyTorch's
// float8_e4m3fn (tests/fp8, tools/make_fp8_golden.py), streaming with bounded memory, and every
// bad input failing with one line that names the file and the tensor or key.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "harness/seed.h"
#include "io/hf_names.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Fresh per test, the same at every call within it (the offsets added to it tell draws apart).
uint64_t test_seed() {
  return test::case_seed();
}

struct TmpDir {
  fs::path path;
  TmpDir() {
    Rng r(test_seed() ^ reinterpret_cast<uintptr_t>(this));
    path = fs::temp_directory_path() / ("mt_hfload_" + std::to_string(r.next_u64()));
    fs::create_directories(path);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& n) const { return (path / n).string(); }
};

fs::path fp8_golden() {
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p / "tests" / "fp8" / "fp8_blocks.safetensors", ec))
      return p / "tests" / "fp8" / "fp8_blocks.safetensors";
    if (p == p.parent_path()) break;
  }
  return {};
}

template <typename E>
void expect_error(const std::function<void()>& f, std::vector<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no error; wanted one naming " << needles.front();
  } catch (const E& e) {
    const std::string w = e.what();
    for (const auto& n : needles) EXPECT_NE(w.find(n), std::string::npos) << w << " lacks " << n;
    EXPECT_EQ(w.find('\n'), std::string::npos) << "not one line: " << w;
  }
}

TEST(Fp8, EveryByteMatchesTheE4m3fnFormat) {
  // Independent of the decoder: the format's definition, value by value.
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x80), 0.f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
}

// Dequantisation equals PyTorch's q.to(float32) * scale bit for bit: partial blocks, scales from
// 1e-4 to 1e3 and 2^-20, every finite byte, +-448.
TEST(Fp8, BlockDequantisationMatchesPyTorch) {
  const fs::path golden = fp8_golden();
  ASSERT_FALSE(golden.empty()) << "tests/fp8/fp8_blocks.safetensors not found";
  SafetensorsModel st(golden.string());
  int cases = 0;
  for (const std::string& name : st.names()) {
    if (st.entry(name).dtype != "F8_E4M3") continue;
    const Tensor got = st.read(name);
    const Tensor want = st.read(name + ".expected");
    ASSERT_EQ(got.shape(), want.shape()) << name;
    for (int64_t i = 0; i < want.numel(); ++i)
      ASSERT_EQ(got.f32()[i], want.f32()[i]) << name << "[" << i << "]";
    ++cases;
  }
  EXPECT_EQ(cases, 4);
  EXPECT_FALSE(st.contains("partial_scale_inv"));  // folded into its weight
}

// Any range of an FP8 tensor decodes to the same values as the whole tensor (its rows' scales
// alone are read), and so does any range of a bf16 one.
TEST(Fp8, RangesEqualTheWholeTensor) {
  const fs::path golden = fp8_golden();
  ASSERT_FALSE(golden.empty()) << "tests/fp8/fp8_blocks.safetensors not found";
  SafetensorsModel st(golden.string());
  Rng rng(test_seed());
  int cases = 0;
  auto check = [&](const SafetensorsModel& m, const std::string& name) {
    const Tensor whole = m.read(name);
    const int64_t n = whole.numel();
    for (int k = 0; k < 20; ++k) {
      const int64_t a = rng.below(n), b = a + 1 + rng.below(n - a);
      std::vector<float> got(static_cast<size_t>(b - a));
      m.read_range(name, a, b - a, got.data());
      for (int64_t i = a; i < b; ++i)
        ASSERT_EQ(0, std::memcmp(&got[static_cast<size_t>(i - a)], whole.f32() + i, 4))
            << name << "[" << i << "] of [" << a << ", " << b << ")";
    }
    ++cases;
  };
  for (const std::string& name : st.names())
    if (st.entry(name).dtype == "F8_E4M3") check(st, name);
  EXPECT_EQ(cases, 4);
  TmpDir dir;
  Tensor w = Tensor::empty({37, 29}, DType::BF16);
  Tensor wide = Tensor::empty({37, 29});
  for (int64_t i = 0; i < wide.numel(); ++i) wide.f32()[i] = static_cast<float>(rng.normal());
  w.copy_from(wide);
  write_safetensors(dir / "bf16.safetensors", {{"w", w}});
  check(SafetensorsModel(dir / "bf16.safetensors"), "w");
  std::vector<float> x(1);
  expect_error<ShapeError>([&] { st.read_range("partial", -1, 1, x.data()); },
                           {"partial", "out of range"});
}

// A DeepSeek-V3 config small enough to write quickly.
json v3_json(int64_t hidden, int64_t vocab, int64_t experts, int64_t ffn, int64_t layers = 3) {
  return json{{"model_type", "deepseek_v3"},
              {"vocab_size", vocab},
              {"hidden_size", hidden},
              {"intermediate_size", ffn},
              {"moe_intermediate_size", ffn},
              {"num_hidden_layers", layers},
              {"num_attention_heads", 2},
              {"q_lora_rank", 16},
              {"kv_lora_rank", 8},
              {"qk_nope_head_dim", 8},
              {"qk_rope_head_dim", 4},
              {"v_head_dim", 8},
              {"n_routed_experts", experts},
              {"num_experts_per_tok", 2},
              {"n_shared_experts", 1},
              {"n_group", 1},
              {"topk_group", 1},
              {"first_k_dense_replace", 1}};
}

void randomize(Model& m, uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : m.params().all())
    for (int64_t i = 0; i < p->value.numel(); ++i)
      p->value.f32()[i] = static_cast<float>(0.3 * rng.normal());
}

// VmRSS or VmHWM of this process, bytes.
int64_t proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;
  return -1;
}

// Loading a multi-shard model adds at most about one tensor to the resident set: the eager
// reader held every tensor of every shard at once (the model's size again).
TEST(HfLoad, StreamingKeepsPeakMemoryBounded) {
  TmpDir dir;
  HfConfig h = hf_config_from_json(v3_json(256, 2048, 8, 256, 8), "v3");
  int64_t model_bytes = 0, largest = 0;
  {
    Model src(h.model, test_seed());
    randomize(src, test_seed() + 1);
    for (const auto& p : src.params().all()) {
      model_bytes += p->value.bytes();
      largest = std::max<int64_t>(largest, p->value.bytes());
    }
    save_hf_model(src, h, dir.path.string(), uint64_t{4} << 20);
  }
  size_t shards = 0;
  for (const auto& e : fs::directory_iterator(dir.path))
    shards += e.path().extension() == ".safetensors";
  ASSERT_GE(shards, 4u);
  Model dst(h.model, test_seed() + 2);
  // The parameters' own pages are resident before the baseline is taken.
  for (const auto& p : dst.params().all()) std::memset(p->value.raw(), 0, p->value.bytes());
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current VmRSS
  const int64_t before = proc_status_kb("VmRSS:");
  const int64_t hwm_reset = proc_status_kb("VmHWM:");
  ASSERT_GT(before, 0);
  if (hwm_reset > before + model_bytes / 8)
    GTEST_SKIP() << "this kernel does not reset VmHWM (clear_refs 5)";
  SafetensorsModel st(dir.path.string());
  uint64_t last = 0, calls = 0;
  import_hf_tensors(dst, "deepseek_v3", st, dir.path.string(),
                    {.progress = [&](uint64_t done, uint64_t total) {
                      EXPECT_GE(done, last);
                      EXPECT_LE(done, total);
                      last = done;
                      ++calls;
                    }});
  const int64_t peak = proc_status_kb("VmHWM:") - before;
  EXPECT_EQ(last, st.total_bytes());
  EXPECT_GT(calls, 10u);
  std::cout << "model " << model_bytes << " bytes in " << shards << " shards, largest tensor "
            << largest << "; peak growth while loading " << peak << "\n";
  EXPECT_LT(peak, model_bytes / 4) << "loading held more than a quarter of the model";
  EXPECT_LT(peak, 2 * largest + (int64_t{1} << 20)) << "loading held more than one tensor";
  // The values arrived.
  Model ref(h.model, test_seed());
  randomize(ref, test_seed() + 1);
  for (const auto& p : ref.params().all())
    ASSERT_EQ(
        0, std::memcmp(p->value.raw(), dst.params().find(p->name)->value.raw(), p->value.bytes()))
        << p->name;
}

// A sharded directory written by save_hf_model, small enough for the error cases.
struct SmallDir {
  TmpDir dir;
  HfConfig h = hf_config_from_json(v3_json(16, 40, 4, 8), "v3");
  SmallDir() {
    Model m(h.model, test_seed());
    save_hf_model(m, h, dir.path.string(), 2048);
  }
  std::string shard_of(const std::string& tensor) const {
    json idx = json::parse(std::ifstream(dir / "model.safetensors.index.json"));
    return idx["weight_map"][tensor].get<std::string>();
  }
  std::string path() const { return dir.path.string(); }
};

TEST(HfLoad, MissingShardNamesTheShardAndATensor) {
  SmallDir d;
  const std::string shard = d.shard_of("model.norm.weight");
  fs::remove(d.dir / shard);
  expect_error<IoError>([&] { load_hf_model(d.path()); }, {shard, "does not exist", "index"});
}

TEST(HfLoad, TruncatedShardNamesTheFileAndTensor) {
  SmallDir d;
  const std::string shard = d.shard_of("model.norm.weight");
  fs::resize_file(d.dir / shard, fs::file_size(d.dir / shard) - 3);
  expect_error<IoError>([&] { load_hf_model(d.path()); }, {shard, "outside the data section"});
}

TEST(HfLoad, ShapeDisagreeingWithConfigNamesTensorAndShard) {
  SmallDir d;
  json cfg = json::parse(std::ifstream(d.dir / "config.json"));
  cfg["kv_lora_rank"] = 6;  // kv_a_proj_with_mqa and kv_b_proj no longer fit
  std::ofstream(d.dir / "config.json") << cfg.dump();
  const std::string shard = d.shard_of("model.layers.0.self_attn.kv_b_proj.weight");
  expect_error<ShapeError>([&] { load_hf_model(d.path()); },
                           {"mis-shaped model.layers.0.self_attn.kv_b_proj.weight", shard});
}

TEST(HfLoad, UnknownFamilyNamesTheFileAndKey) {
  SmallDir d;
  json cfg = json::parse(std::ifstream(d.dir / "config.json"));
  cfg["model_type"] = "llama";
  std::ofstream(d.dir / "config.json") << cfg.dump();
  expect_error<ConfigError>([&] { load_hf_model(d.path()); },
                            {"config.json", "model_type 'llama'"});
}

// Writes `tensors` in the safetensors byte layout with an F8_E4M3 entry, independently of
// write_safetensors (which has no FP8 dtype).
void write_fp8_file(const std::string& path, const std::string& name, int64_t R, int64_t C,
                    const std::vector<uint8_t>& q, const std::vector<float>* scale,
                    std::vector<int64_t> scale_shape) {
  json h;
  uint64_t off = 0;
  h[name] = {{"dtype", "F8_E4M3"}, {"shape", {R, C}}, {"data_offsets", {off, off + q.size()}}};
  off += q.size();
  if (scale) {
    const uint64_t n = scale->size() * 4;
    h[name + "_scale_inv"] = {
        {"dtype", "F32"}, {"shape", scale_shape}, {"data_offsets", {off, off + n}}};
  }
  std::string text = h.dump();
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << text;
  out.write(reinterpret_cast<const char*>(q.data()), static_cast<std::streamsize>(q.size()));
  if (scale)
    out.write(reinterpret_cast<const char*>(scale->data()),
              static_cast<std::streamsize>(scale->size() * 4));
}

TEST(HfLoad, Fp8WithoutScaleNamesTensorAndFile) {
  TmpDir dir;
  std::vector<uint8_t> q(3 * 5, 0x38);
  write_fp8_file(dir / "model.safetensors", "w.weight", 3, 5, q, nullptr, {});
  expect_error<IoError>([&] { SafetensorsModel st(dir.path.string()); },
                        {"model.safetensors", "FP8 tensor 'w.weight'", "w.weight_scale_inv"});
  // A scale of the wrong block grid: 200 columns in 128-wide blocks need 2.
  std::vector<uint8_t> big(2 * 200, 0x38);
  std::vector<float> s = {1.f};
  write_fp8_file(dir / "model.safetensors", "w.weight", 2, 200, big, &s, {1, 1});
  expect_error<ShapeError>([&] { SafetensorsModel st(dir.path.string()); },
                           {"model.safetensors", "w.weight_scale_inv", "[1,2]"});
  // With a config's own block size the same grid is right.
  SafetensorsModel ok(dir.path.string(), Fp8Blocks{128, 256});
  const Tensor w = ok.read("w.weight");
  EXPECT_EQ(w.f32()[399], 1.f);
}

// Nothing but the model's own parameters is allocated per tensor: bf16 and fp16 files load too.
TEST(HfLoad, HalfPrecisionShardsLoad) {
  TmpDir dir;
  HfConfig h = hf_config_from_json(v3_json(16, 40, 4, 8), "v3");
  Model m(h.model, test_seed());
  randomize(m, test_seed() + 3);
  TensorMap t = export_hf_tensors(m, "deepseek_v3");
  TensorMap bf;
  for (auto& [name, v] : t) {
    Tensor b = Tensor::empty(v.shape(), DType::BF16);
    b.copy_from(v);
    bf[name] = b;
    v.copy_from(b);  // what the model must hold after loading: the bf16 values
  }
  write_safetensors_sharded(dir.path.string(), bf, {}, 1024);
  std::ofstream(dir / "config.json") << v3_json(16, 40, 4, 8).dump();
  LoadedModel lm = load_hf_model(dir.path.string());
  TensorMap back = export_hf_tensors(*lm.model, "deepseek_v3");
  for (const auto& [name, v] : t)
    ASSERT_EQ(0, std::memcmp(v.raw(), back.at(name).raw(), v.bytes())) << name;
}

}  // namespace
}  // namespace mt
