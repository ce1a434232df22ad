// `moetrain report`: PNGs from a synthetic metrics.jsonl in the trainer's format, and clear
// errors for missing, empty and malformed runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "train/report.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() /
                     ("moetrain-report-" + tag + "-" + std::to_string(std::random_device{}()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

bool is_png(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  unsigned char sig[8] = {};
  in.read(reinterpret_cast<char*>(sig), 8);
  const unsigned char want[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  return in.gcount() == 8 && std::equal(sig, sig + 8, want) && fs::file_size(p) > 1000;
}

void write_metrics(const fs::path& dir, std::mt19937& gen) {
  std::ofstream out(dir / "metrics.jsonl");
  std::uniform_real_distribution<double> u(0, 1);
  for (int step = 5; step <= 123; step += step == 120 ? 3 : 5) {
    nlohmann::json loads = nlohmann::json::array();
    for (int layer : {1, 2, 3})
      loads.push_back({{"layer", layer},
                       {"max_over_mean", 1 + 2 * u(gen) / std::sqrt(step)},
                       {"hot_cold", 1 + 5 * u(gen)},
                       {"dead", 0}});
    out << nlohmann::json{{"step", step},
                          {"loss", 4 * std::exp(-step / 50.0) + 0.1 * u(gen) + 1},
                          {"loss_per_corpus", {{"train", 2.0}}},
                          {"lr", 1e-3 * std::min(1.0, step / 20.0)},
                          {"grad_norm", 1 + u(gen)},
                          {"tokens_per_s", 900 + 100 * u(gen)},
                          {"peak_rss_mb", 300},
                          {"expert_load", loads},
                          {"aux", {{"router_z", 0.1}}}}
               .dump()
        << "\n";
    if (step % 40 == 0)
      out << nlohmann::json{{"step", step},
                            {"eval",
                             {{"code", {{"loss", 3 * std::exp(-step / 60.0) + 1.5}}},
                              {"prose", {{"loss", 3.5 - step / 200.0}}}}}}
                 .dump()
          << "\n";
  }
}

TEST(Report, WritesValidPngs) {
  std::mt19937 gen(std::random_device{}());
  const fs::path dir = fresh_dir("ok");
  write_metrics(dir, gen);
  const std::vector<std::string> files = render_report(dir.string());
  ASSERT_EQ(files.size(), 4u);
  for (const char* n : {"loss.png", "throughput.png", "optim.png", "expert_load.png"}) {
    EXPECT_TRUE(is_png(dir / "plots" / n)) << n;
  }
  EXPECT_FALSE(fs::exists(dir / "plots" / ".tmp-report"));
  if (!std::getenv("MOETRAIN_KEEP_REPORT")) fs::remove_all(dir);
}

TEST(Report, MissingRunDirectoryIsAnIoError) {
  const fs::path dir = fresh_dir("missing");
  fs::remove_all(dir);
  try {
    render_report(dir.string());
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

TEST(Report, EmptyRunDirectoryNamesMetricsFile) {
  const fs::path dir = fresh_dir("empty");
  try {
    render_report(dir.string());
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "metrics.jsonl") << "\n";
  EXPECT_THROW(render_report(dir.string()), ValueError);
  fs::remove_all(dir);
}

TEST(Report, MalformedLineIsNamed) {
  const fs::path dir = fresh_dir("bad");
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\n";
  try {
    render_report(dir.string());
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt
