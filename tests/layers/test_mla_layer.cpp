#include <gtest/gtest.h>

#include "layers/test_mla_layer_case.h"
#include "model/mla_layer.h"
#include "ref/mla_ref.h"

namespace mt::test {
namespace {

const std::vector<int64_t> kLengths{30, 37};  // T = 67 over two documents

MlaConfig base_config() {
  return {.hidden = 24,
          .heads = 3,
          .q_lora_rank = 16,
          .kv_lora_rank = 12,
          .qk_nope_dim = 8,
          .qk_rope_dim = 4,
          .v_head_dim = 6,
          .rope_theta = 10000.f,
          .rope_style = ops::RopeStyle::Interleaved,
          .use_rope = true,
          .norm_eps = 1e-6f,
          .softmax_scale = 0,
          .output_gate = true};
}

LayerCaseSpec mla_case(const std::string& name, const MlaConfig& cfg) {
  LayerCaseSpec s;
  s.name = name;
  s.make = [cfg] { return std::make_unique<MlaLayer>(cfg); };
  s.lengths = kLengths;
  s.hidden = cfg.hidden;
  s.reference = [cfg](const std::map<std::string, DVec>& p, const DVec& x) {
    return std::vector<DVec>{ref::mla_layer(cfg, p, x, offsets_of(kLengths))};
  };
  return s;
}

CheckOptions layer_tolerances() {
  return {.fwd_rtol = 2e-5, .grad_rtol = 2e-4};
}

TEST(MlaLayer, QLoraGatedInterleavedRope) {
  LayerCase c(mla_case("mla_qlora_gated", base_config()));
  check_op(c, layer_tolerances());
}

TEST(MlaLayer, DirectQueryNoRopeNoGate) {
  MlaConfig cfg = base_config();
  cfg.q_lora_rank = 0;
  cfg.use_rope = false;  // kimi_linear's mla_use_nope: the rotary slice exists but is not rotated
  cfg.output_gate = false;
  LayerCase c(mla_case("mla_direct_q_nope", cfg));
  check_op(c, layer_tolerances());
}

TEST(MlaLayer, HalfSplitRopeCustomScale) {
  MlaConfig cfg = base_config();
  cfg.rope_style = ops::RopeStyle::HalfSplit;
  cfg.qk_nope_dim = 6;
  cfg.qk_rope_dim = 6;
  cfg.softmax_scale = 0.3f;
  cfg.heads = 2;
  LayerCase c(mla_case("mla_halfsplit_scale", cfg));
  check_op(c, layer_tolerances());
}

TEST(MlaLayer, SingleDocumentNoNopePart) {
  MlaConfig cfg = base_config();
  cfg.qk_nope_dim = 0;
  cfg.qk_rope_dim = 8;
  LayerCaseSpec s = mla_case("mla_rope_only", cfg);
  s.lengths = {23};
  s.reference = [cfg](const std::map<std::string, DVec>& p, const DVec& x) {
    return std::vector<DVec>{ref::mla_layer(cfg, p, x, offsets_of({23}))};
  };
  LayerCase c(s);
  check_op(c, layer_tolerances());
}

// LoRA on every projection with the base weights frozen (bound without gradients).
TEST(MlaLayer, LoraFrozenBase) {
  MlaConfig cfg = base_config();
  cfg.lora = {.rank = 3, .alpha = 6.f};
  LayerCaseSpec s = mla_case("mla_lora", cfg);
  s.frozen = [](const std::string& n) {
    return ends_with(n, "proj.weight") || ends_with(n, "mqa.weight");
  };
  LayerCase c(s);
  check_op(c, layer_tolerances());
}

TEST(MlaLayer, ParamNamesFollowDeepseekV3) {
  MlaLayer a(base_config());
  std::vector<std::string> names;
  for (const ParamSpec& p : a.param_specs()) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight",
                                      "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight",
                                      "kv_b_proj.weight", "o_proj.weight", "g_proj.weight"}));
  MlaConfig cfg = base_config();
  cfg.q_lora_rank = 0;
  cfg.output_gate = false;
  MlaLayer b(cfg);
  EXPECT_EQ(b.param_specs().front().name, "q_proj.weight");
  EXPECT_EQ(b.param_specs().front().shape, (Shape{3 * 12, 24}));
}

TEST(MlaLayer, BadConfigIsAnError) {
  MlaConfig cfg = base_config();
  cfg.qk_rope_dim = 3;
  EXPECT_THROW(MlaLayer{cfg}, ConfigError);
  cfg = base_config();
  cfg.kv_lora_rank = 0;
  EXPECT_THROW(MlaLayer{cfg}, ConfigError);
}

}  // namespace
}  // namespace mt::test
