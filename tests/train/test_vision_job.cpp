// Job keys of a kimi_k25 model (train/job.h): LoRA on the multimodal projector and on the vision
// tower (lora.targets vision_projector / vision_tower), and model.vision_tower = auto | train |
// freeze, checked on the parameters a model built from the job trains.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "train/job.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;

std::string k25_config() {
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); !p.empty(); p = p.parent_path()) {
    fs::path f = p / "tests" / "golden" / "k25_a" / "model" / "config.json";
    if (fs::exists(f, ec)) return f.string();
    if (p == p.parent_path()) break;
  }
  return {};
}

// Trainable parameters of a model built from `toml`, counted by where they live.
struct Trained {
  int tower = 0, tower_lora = 0, projector = 0, projector_lora = 0, lm = 0, lm_lora = 0;
  int tower_total = 0;
};

Trained trained(const std::string& toml) {
  const Job job = Job::parse(toml, "test.toml");
  Model m(job_model_config(job), 1, job_model_options(job));
  Trained t;
  for (const auto& p : m.params().all()) {
    const bool lora = p->name.find("lora_") != std::string::npos;
    const bool tower = p->name.rfind("model.vision_tower.", 0) == 0;
    const bool projector = p->name.rfind("model.mm_projector.", 0) == 0;
    if (tower && !lora) ++t.tower_total;
    if (!p->trainable()) continue;
    if (tower)
      ++(lora ? t.tower_lora : t.tower);
    else if (projector)
      ++(lora ? t.projector_lora : t.projector);
    else
      ++(lora ? t.lm_lora : t.lm);
  }
  return t;
}

class VisionJob : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = k25_config();
    if (cfg_.empty()) GTEST_SKIP() << "no tests/golden/k25_a";
  }
  std::string job(const std::string& body) const {
    return "[model]\nconfig = \"" + cfg_ + "\"\n" + body + "[data]\ntrain = \"unused\"\n";
  }
  std::string cfg_;
};

TEST_F(VisionJob, ProjectorLoraFreezesTowerAndBase) {
  const Trained t = trained(job("[lora]\ntargets = [\"attention\", \"vision_projector\"]\n"));
  EXPECT_EQ(t.projector_lora, 4);  // A and B of in_proj and out_proj
  EXPECT_EQ(t.projector, 0);
  EXPECT_EQ(t.tower + t.tower_lora, 0);
  EXPECT_GT(t.lm_lora, 0);
  EXPECT_EQ(t.lm, 0);
}

TEST_F(VisionJob, TowerTrainsInFullUnderLoraWhenAsked) {
  const Trained t =
      trained(job("vision_tower = \"train\"\n[lora]\ntargets = [\"vision_projector\"]\n"));
  EXPECT_EQ(t.tower, t.tower_total);
  EXPECT_GT(t.tower, 0);
  EXPECT_EQ(t.projector_lora, 4);
  EXPECT_EQ(t.lm + t.lm_lora, 0);
}

TEST_F(VisionJob, TowerLoraAndFrozenTowerInFullTraining) {
  // LoRA on the tower: every block projection gets an adapter, the tower's weights stay frozen.
  Trained t = trained(job("[lora]\ntargets = [\"vision_tower\"]\n"));
  EXPECT_EQ(t.tower_lora, 2 * 6 * 2);  // 2 blocks x 6 projections x (A, B)
  EXPECT_EQ(t.tower, 0);
  // Full training trains the tower unless it is frozen.
  t = trained(job(""));
  EXPECT_EQ(t.tower, t.tower_total);
  EXPECT_GT(t.lm, 0);
  EXPECT_GT(t.projector, 0);
  t = trained(job("vision_tower = \"freeze\"\n"));
  EXPECT_EQ(t.tower, 0);
  EXPECT_GT(t.lm, 0);
  EXPECT_GT(t.projector, 0);
}

TEST_F(VisionJob, BadKeysAreNamedErrors) {
  auto message = [&](const std::string& toml) {
    try {
      const Job j = Job::parse(toml, "test.toml");
      Model m(job_model_config(j), 1, job_model_options(j));
    } catch (const ConfigError& e) {
      return e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(message(job("vision_tower = \"sometimes\"\n")).find("model.vision_tower"),
            std::string::npos);
  const std::string text_only =
      "[model]\nconfig = \"tiny\"\n[lora]\ntargets = [\"vision_projector\"]\n[data]\ntrain = "
      "\"unused\"\n";
  EXPECT_NE(message(text_only).find("vision_projector"), std::string::npos);
  EXPECT_NE(message("[model]\nconfig = \"tiny\"\nvision_tower = \"train\"\n[data]\ntrain = "
                    "\"unused\"\n")
                .find("no vision tower"),
            std::string::npos);
}

}  // namespace
}  // namespace mt::test
