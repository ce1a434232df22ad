// Conformance with HuggingFace transformers: every case under tests/golden/ (written by
// tools/make_golden.py) is loaded and its logits, loss and every parameter gradient compared.
// Tests are registered from the directory contents at start-up, one per case, so a checkout
// without goldens simply has none (GoldenCases.Inventory says so) instead of a failing test.
// gtest_discover_tests lists tests when this binary is built: rebuild it after adding goldens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "core/device.h"
#include "io/hf_forward.h"
#include "model/vision/vision_front.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// MOETRAIN_GOLDEN_DIR, else the first tests/golden found walking up from the working directory
// (ctest runs in build/tests).
fs::path golden_root() {
  if (const char* env = std::getenv("MOETRAIN_GOLDEN_DIR")) return env;
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); !p.empty(); p = p.parent_path()) {
    if (fs::is_directory(p / "tests" / "golden", ec)) return p / "tests" / "golden";
    if (p == p.parent_path()) break;
  }
  return {};
}

std::vector<fs::path> golden_cases(const fs::path& root) {
  std::vector<fs::path> cases;
  std::error_code ec;
  if (root.empty()) return cases;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && fs::exists(e.path() / "outputs.safetensors")) cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());
  return cases;
}

// ||a - b|| / ||b|| in double; with ||b|| = 0, the plain ||a||.
double rel_err(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    double d = static_cast<double>(a.f32()[i]) - b.f32()[i];
    num += d * d;
    den += static_cast<double>(b.f32()[i]) * b.f32()[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The same goldens on either device: the GPU runs the fp32 model the loader built, so the bounds
// are transformers' against ours, as on the CPU.
void check_case(const fs::path& dir, Device device) {
  LoadedModel lm = load_hf_model((dir / "model").string());
  SafetensorsData in = read_safetensors((dir / "inputs.safetensors").string());
  SafetensorsData want = read_safetensors((dir / "outputs.safetensors").string());
  ASSERT_TRUE(in.tensors.count("input_ids"));
  Context ctx(ContextOptions{.device = device});
  const ImageBatch images = read_image_inputs(in.tensors);  // kimi_k25 cases
  HfForwardResult got = hf_forward(ctx, lm, in.tensors.at("input_ids"), /*grads=*/true, &images);

  const Tensor& logits = want.tensors.at("logits");
  ASSERT_EQ(got.logits.shape(), logits.shape());
  EXPECT_LE(rel_err(got.logits, logits), 1e-4) << "logits";
  double loss = want.tensors.at("loss").f32()[0];
  EXPECT_LE(std::abs(got.loss - loss), 1e-4 * std::abs(loss))
      << "loss " << got.loss << " vs " << loss;
  int compared = 0;
  for (const auto& [name, g] : want.tensors) {
    if (name == "logits" || name == "loss") continue;
    auto it = got.grads.find(name);
    if (g.numel() == 0 && it == got.grads.end()) continue;  // zero-width HF module
    if (it == got.grads.end()) {
      ADD_FAILURE() << "no gradient for " << name;
      continue;
    }
    ASSERT_EQ(it->second.shape(), g.shape()) << name;
    double e = rel_err(it->second, g);
    EXPECT_LE(e, 1e-3) << "gradient " << name << ": relative error " << e;
    ++compared;
  }
  for (const auto& [name, g] : got.grads)
    EXPECT_TRUE(want.tensors.count(name)) << "gradient " << name << " missing from the golden";
  EXPECT_GT(compared, 0);
}

class GoldenCase : public ::testing::Test {
 public:
  GoldenCase(fs::path dir, Device device) : dir_(std::move(dir)), device_(device) {}
  void TestBody() override {
    if (device_ == Device::CUDA && !cuda_available())
      GTEST_SKIP() << "no GPU visible (or built without CUDA): golden on CUDA skipped";
    check_case(dir_, device_);
  }

 private:
  fs::path dir_;
  Device device_;
};

// Always present: says where goldens were looked for and how many were found.
TEST(GoldenCases, Inventory) {
  fs::path root = golden_root();
  size_t n = golden_cases(root).size();
  std::cout << "golden cases: " << n << " under "
            << (root.empty() ? std::string("(no tests/golden directory found)") : root.string())
            << (n == 0 ? " -- run tools/make_golden.py to create them" : "") << "\n";
  if (n == 0) GTEST_SKIP() << "no golden cases found";
}

void register_cases() {
  for (const fs::path& dir : golden_cases(golden_root())) {
    std::string name = dir.filename().string();
    ::testing::RegisterTest(
        "Golden", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
        [dir]() -> ::testing::Test* { return new GoldenCase(dir, Device::CPU); });
    // `moetrain forward --device cuda`'s path: the same cases on the GPU (skipped without one).
    if (MOETRAIN_WITH_CUDA)
      ::testing::RegisterTest(
          "GoldenCuda", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
          [dir]() -> ::testing::Test* { return new GoldenCase(dir, Device::CUDA); });
  }
}

}  // namespace
}  // namespace mt

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  mt::register_cases();
  return RUN_ALL_TESTS();
}
