#include "io/hf_names.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/rng.h"
#include "harness/seed.h"
#include "io/hf_forward.h"

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
    path = fs::temp_directory_path() / ("mt_hf_" + std::to_string(r.next_u64()));
    fs::create_directories(path);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

json kimi_json() {
  return json::parse(R"({
    "model_type": "kimi_linear", "vocab_size": 53, "hidden_size": 16, "intermediate_size": 24,
    "moe_intermediate_size": 8, "num_hidden_layers": 3, "num_attention_heads": 2,
    "kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4,
    "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1,
    "linear_attn_config": {"kda_layers": [1, 3], "full_attn_layers": [2], "head_dim": 4,
                           "num_heads": 2, "short_conv_kernel_size": 3},
    "first_k_dense_replace": 1, "mla_use_nope": true
  })");
}

json v32_json() {
  return json::parse(R"({
    "model_type": "deepseek_v32", "vocab_size": 41, "hidden_size": 16, "intermediate_size": 20,
    "moe_intermediate_size": 6, "num_hidden_layers": 2, "num_attention_heads": 2,
    "q_lora_rank": 8, "kv_lora_rank": 6, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
    "v_head_dim": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 0,
    "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "index_n_heads": 2,
    "index_head_dim": 4, "index_topk": 3, "num_nextn_predict_layers": 1
  })");
}

void randomize(Model& m, uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : m.params().all())
    for (int64_t i = 0; i < p->value.numel(); ++i)
      p->value.f32()[i] = static_cast<float>(0.3 * rng.normal());
}

void expect_same_params(const Model& a, const Model& b) {
  ASSERT_EQ(a.params().all().size(), b.params().all().size());
  for (const auto& p : a.params().all()) {
    const Param* q = b.params().find(p->name);
    ASSERT_NE(q, nullptr) << p->name;
    ASSERT_EQ(p->value.shape(), q->value.shape()) << p->name;
    EXPECT_EQ(0, std::memcmp(p->value.raw(), q->value.raw(), p->value.bytes())) << p->name;
  }
}

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Rng rng(seed);
  Tensor t = Tensor::empty({B, T}, DType::I64);
  for (int64_t i = 0; i < B * T; ++i) t.i64()[i] = rng.below(V);
  return t;
}

TEST(HfNames, KimiFusedConvAndALogLayout) {
  HfConfig h = hf_config_from_json(kimi_json(), "kimi");
  Model m(h.model, test_seed());
  randomize(m, test_seed() + 1);
  TensorMap t = export_hf_tensors(m, "kimi_linear");
  const std::string p = "model.layers.0.self_attn.";
  ASSERT_TRUE(t.count(p + "conv1d.weight"));
  EXPECT_FALSE(t.count(p + "q_conv1d.weight"));
  EXPECT_EQ(t.at(p + "conv1d.weight").shape(), Shape({24, 1, 3}));
  EXPECT_EQ(t.at(p + "forget_gate.A_log").shape(), Shape({1, 1, 2, 1}));
  EXPECT_TRUE(t.count(p + "forget_gate.f_a_proj.weight"));
  EXPECT_TRUE(t.count(p + "forget_gate.dt_bias"));
  // Rows 8..15 of the fused conv are k's.
  const Tensor& kc = m.params().at(p + "k_conv1d.weight").value;
  EXPECT_EQ(0, std::memcmp(t.at(p + "conv1d.weight").f32() + 8 * 3, kc.raw(), kc.bytes()));
  EXPECT_TRUE(t.count("model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(t.count("model.layers.1.mlp.shared_experts.gate_proj.weight"));
  EXPECT_TRUE(t.count("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(t.count("model.layers.1.mlp.gate.e_score_correction_bias"));

  Model fresh(h.model, test_seed() + 99);
  import_hf_tensors(fresh, "kimi_linear", t, "mem");
  expect_same_params(m, fresh);
}

TEST(HfNames, PerExpertTensorsAreFused) {
  HfConfig h = hf_config_from_json(kimi_json(), "kimi");
  Model m(h.model, test_seed());
  randomize(m, test_seed() + 2);
  TensorMap t = export_hf_tensors(m, "kimi_linear");
  for (int layer : {1, 2}) {
    const std::string b = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    Tensor gu = t.at(b + "gate_up_proj"), dn = t.at(b + "down_proj");
    t.erase(b + "gate_up_proj");
    t.erase(b + "down_proj");
    const int64_t E = 4, F = 8, d = 16;
    for (int64_t e = 0; e < E; ++e) {
      const std::string n = b + std::to_string(e) + ".";
      t[n + "gate_proj.weight"] = gu.rows(e, e + 1).view({2 * F, d}).rows(0, F).clone();
      t[n + "up_proj.weight"] = gu.rows(e, e + 1).view({2 * F, d}).rows(F, 2 * F).clone();
      t[n + "down_proj.weight"] = dn.rows(e, e + 1).view({d, F}).clone();
    }
  }
  Model fresh(h.model, test_seed() + 5);
  import_hf_tensors(fresh, "kimi_linear", t, "mem");
  expect_same_params(m, fresh);
}

TEST(HfNames, ErrorsListEveryBadTensor) {
  HfConfig h = hf_config_from_json(v32_json(), "v32");
  Model m(h.model, test_seed());
  TensorMap t = export_hf_tensors(m, "deepseek_v32");
  t.erase("model.layers.0.self_attn.kv_b_proj.weight");
  t["model.layers.0.self_attn.bogus.weight"] = Tensor::zeros({2});
  t["model.norm.weight"] = Tensor::zeros({15});
  // A multi-token-prediction layer beyond num_hidden_layers is skipped, not an error.
  t["model.layers.2.eh_proj.weight"] = Tensor::zeros({3});
  try {
    import_hf_tensors(m, "deepseek_v32", t, "ckpt");
    ADD_FAILURE() << "bad tensors accepted";
  } catch (const ShapeError& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("3 tensor problem"), std::string::npos) << w;
    EXPECT_NE(w.find("missing model.layers.0.self_attn.kv_b_proj.weight"), std::string::npos) << w;
    EXPECT_NE(w.find("unexpected model.layers.0.self_attn.bogus.weight"), std::string::npos) << w;
    EXPECT_NE(w.find("mis-shaped model.norm.weight: file [15] f32, expected [16]"),
              std::string::npos)
        << w;
    EXPECT_EQ(w.find("eh_proj"), std::string::npos) << w;
  }
}

// Saved kimi_linear directories use the original checkpoint spelling, as save_pretrained does.
TEST(HfNames, KimiSavesCheckpointSpelling) {
  TmpDir dir;
  HfConfig h = hf_config_from_json(kimi_json(), "kimi");
  Model m(h.model, test_seed());
  save_hf_model(m, h, dir.path.string());
  SafetensorsData d = read_safetensors_model(dir.path.string());
  EXPECT_TRUE(d.tensors.count("model.layers.1.block_sparse_moe.experts.3.w1.weight"));
  EXPECT_TRUE(d.tensors.count("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  EXPECT_TRUE(d.tensors.count("model.layers.0.self_attn.q_conv1d.weight"));
  EXPECT_TRUE(d.tensors.count("model.layers.0.self_attn.A_log"));
  EXPECT_TRUE(d.tensors.count("model.layers.0.block_sparse_moe.gate_proj.weight"));
  EXPECT_FALSE(d.tensors.count("model.layers.1.mlp.experts.gate_up_proj"));
}

// save -> load -> forward gives the same logits, loss and gradients (hybrid and both HF types).
void round_trip(const HfConfig& h, uint64_t seed) {
  TmpDir dir;
  LoadedModel a{h, std::make_unique<Model>(h.model, seed)};
  randomize(*a.model, seed + 1);
  // Small shards exercise the sharded writer and reader.
  save_hf_model(*a.model, h, dir.path.string(), 4096);
  LoadedModel b = load_hf_model(dir.path.string());
  expect_same_params(*a.model, *b.model);
  Context ctx;
  Tensor ids = random_ids(2, 7, h.model.vocab, seed + 2);
  HfForwardResult ra = hf_forward(ctx, a, ids, true);
  HfForwardResult rb = hf_forward(ctx, b, ids, true);
  EXPECT_EQ(ra.loss, rb.loss);
  EXPECT_TRUE(std::isfinite(ra.loss));
  EXPECT_EQ(ra.logits.shape(), Shape({2, 7, h.model.vocab}));
  EXPECT_EQ(0, std::memcmp(ra.logits.raw(), rb.logits.raw(), ra.logits.bytes()));
  ASSERT_EQ(ra.grads.size(), rb.grads.size());
  for (const auto& [name, g] : ra.grads)
    EXPECT_EQ(0, std::memcmp(g.raw(), rb.grads.at(name).raw(), g.bytes())) << name;
}

// Every parameter's slices read by HfSliceReader equal the same elements of a whole load (the
// path checked against transformers), bit for bit: random ranges that straddle the parts of a
// fused tensor (per-expert gate/up/down, kimi's q/k/v conv1d), single elements, whole tensors.
void slices_equal_full_load(const HfConfig& h, uint64_t seed) {
  TmpDir dir;
  {
    Model m(h.model, seed);
    randomize(m, seed + 1);
    save_hf_model(m, h, dir.path.string(), 4096);
  }
  LoadedModel full = load_hf_model(dir.path.string());
  SafetensorsModel st(dir.path.string());
  const Model shape_only(h.model, seed + 2, {.defer_weights = true});
  HfSliceReader reader(shape_only, h.model_type, st, dir.path.string());
  Rng rng(seed + 3);
  int64_t ranges = 0;
  for (const auto& p : full.model->params().all()) {
    const int64_t n = p->value.numel();
    const float* want = p->value.f32();
    std::vector<std::pair<int64_t, int64_t>> rs = {{0, n}, {n - 1, n}};
    for (int k = 0; k < 6; ++k) {
      const int64_t a = rng.below(n), b = a + 1 + rng.below(n - a);
      rs.emplace_back(a, b);
    }
    for (const auto& [a, b] : rs) {
      std::vector<float> got(static_cast<size_t>(b - a), std::nanf(""));
      const Param* q = shape_only.params().find(p->name);
      ASSERT_NE(q, nullptr) << p->name;
      ASSERT_TRUE(reader.read(*q, a, b, got.data())) << p->name;
      ASSERT_EQ(0, std::memcmp(got.data(), want + a, got.size() * sizeof(float)))
          << p->name << " [" << a << ", " << b << ")";
      ++ranges;
    }
  }
  EXPECT_GT(ranges, 100);
  const Param& any = *shape_only.params().all().front();
  float x = 0;
  EXPECT_THROW(reader.read(any, 0, any.spec.shape.numel() + 1, &x), ShapeError);
}

TEST(HfNames, SlicesEqualTheFullLoadKimi) {
  slices_equal_full_load(hf_config_from_json(kimi_json(), "kimi"), test_seed());
}
TEST(HfNames, SlicesEqualTheFullLoadDeepseekV32) {
  slices_equal_full_load(hf_config_from_json(v32_json(), "v32"), test_seed());
}
TEST(HfNames, SlicesEqualTheFullLoadHybrid) {
  slices_equal_full_load(hybrid_hf_config(ModelConfig::load("tiny")), test_seed());
}

// A slice reader checks names and shapes up front, as a whole load does.
TEST(HfNames, SliceReaderRefusesAMismatchedCheckpoint) {
  TmpDir dir;
  const HfConfig h = hf_config_from_json(v32_json(), "v32");
  {
    Model m(h.model, test_seed());
    save_hf_model(m, h, dir.path.string(), 4096);
  }
  HfConfig other = h;
  other.model.hidden = 24;
  SafetensorsModel st(dir.path.string());
  const Model shape_only(other.model, test_seed(), {.defer_weights = true});
  try {
    HfSliceReader reader(shape_only, h.model_type, st, dir.path.string());
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("mis-shaped model.embed_tokens.weight"), std::string::npos)
        << e.what();
  }
}

TEST(HfNames, HybridSaveLoadForwardEqual) {
  round_trip(hybrid_hf_config(ModelConfig::load("tiny")), test_seed());
}
TEST(HfNames, KimiSaveLoadForwardEqual) {
  round_trip(hf_config_from_json(kimi_json(), "kimi"), test_seed());
}
TEST(HfNames, DeepseekV32SaveLoadForwardEqual) {
  round_trip(hf_config_from_json(v32_json(), "v32"), test_seed());
}

// The loss is the mean next-token cross-entropy of the returned logits (independent check).
TEST(HfNames, LossMatchesLogits) {
  HfConfig h = hf_config_from_json(kimi_json(), "kimi");
  LoadedModel lm{h, std::make_unique<Model>(h.model, test_seed())};
  randomize(*lm.model, test_seed() + 3);
  Context ctx;
  const int64_t B = 2, T = 5, V = h.model.vocab;
  Tensor ids = random_ids(B, T, V, test_seed() + 4);
  HfForwardResult r = hf_forward(ctx, lm, ids, false);
  double sum = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) {
      const float* row = r.logits.f32() + (b * T + t) * V;
      double mx = row[0], z = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
      sum += mx + std::log(z) - row[ids.i64()[b * T + t + 1]];
    }
  EXPECT_NEAR(r.loss, sum / (B * (T - 1)), 1e-5 * std::abs(r.loss));
}

// The loading display: on a terminal one redrawn line with bytes, rate and time left, ending
// with the time taken; elsewhere one line per quarter, however many reads there are.
TEST(HfNames, ProgressPrinterShowsRateOnATerminalAndQuartersElsewhere) {
  const uint64_t total = 3000000;
  std::ostringstream tty, plain;
  const ProgressFn t = progress_printer(tty, "m", true), p = progress_printer(plain, "m", false);
  for (uint64_t done = 30000; done <= total; done += 30000) {
    t(done, total);
    p(done, total);
  }
  const std::string a = tty.str(), b = plain.str();
  EXPECT_EQ(std::count(a.begin(), a.end(), '\r'), 100) << a;  // one redraw per percent
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 1);
  EXPECT_NE(a.find("] 50% 1.50/3.00 MB "), std::string::npos) << a;
  EXPECT_NE(a.find(" MB/s ETA 0:"), std::string::npos) << a;
  EXPECT_NE(a.find("] 100% 3.00/3.00 MB "), std::string::npos) << a;
  EXPECT_NE(a.find(" s\033[K\n"), std::string::npos) << a;  // the last line: the time taken
  EXPECT_EQ(b,
            "loading m: 0% 0.03/3.00 MB\nloading m: 25% 0.75/3.00 MB\nloading m: 50% 1.50/3.00 "
            "MB\nloading m: 75% 2.25/3.00 MB\nloading m: 100% 3.00/3.00 MB\n");
}

}  // namespace
}  // namespace mt
