// The C++ image processor against transformers' Kimi_K25ImageProcessor itself (goldens by
// tools/make_vision_golden.py in tests/golden/k25_preprocess: PNGs, the processor's resized
// uint8 images and its pixel_values), in two separate checks:
//  - resize: decode + navit sizes + antialiased bicubic vs torchvision's uint8 result. Both
//    compute in fixed point with rounding to uint8 between the horizontal and vertical passes,
//    but with different weight precision (Pillow-style 22-bit here, torchvision's uint8 kernel
//    14-bit), so a pixel whose exact value lies near a rounding boundary may land one level
//    apart: tolerance 1 level of 255, and a mean absolute difference under 0.01 levels (all but
//    a fraction of a percent of the values equal; measured: 0.3%).
//  - normalise + patchify on the processor's own resized image: equal to 1e-6 (float rounding
//    of (v / 255 - mean) / std; torchvision folds the rescale into the normalisation).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "io/image_file.h"
#include "io/safetensors.h"
#include "model/vision/image_processor.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;

fs::path preprocess_dir() {
  if (const char* env = std::getenv("MOETRAIN_GOLDEN_DIR")) return fs::path(env) / "k25_preprocess";
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); !p.empty(); p = p.parent_path()) {
    fs::path d = p / "tests" / "golden" / "k25_preprocess";
    if (fs::is_directory(d, ec)) return d;
    if (p == p.parent_path()) break;
  }
  return {};
}

// The limits make_vision_golden.py gives the processor.
ImageProcessorConfig golden_config() {
  ImageProcessorConfig c;
  c.patch_size = 14;
  c.merge_size = 2;
  c.max_patches = 64;
  c.max_side_patches = 10;
  return c;
}

struct Golden {
  fs::path dir;
  SafetensorsData data;
  int images = 0;
};

Golden load() {
  Golden g;
  g.dir = preprocess_dir();
  if (g.dir.empty()) return g;
  g.data = read_safetensors((g.dir / "preprocess.safetensors").string());
  while (g.data.tensors.count("resized_" + std::to_string(g.images))) ++g.images;
  return g;
}

TEST(ImageGolden, ResizeMatchesTransformersWithinOneLevel) {
  Golden g = load();
  if (g.images == 0) GTEST_SKIP() << "no tests/golden/k25_preprocess";
  const ImageProcessorConfig cfg = golden_config();
  for (int i = 0; i < g.images; ++i) {
    SCOPED_TRACE("image " + std::to_string(i));
    const ImageU8 img = read_image((g.dir / ("image_" + std::to_string(i) + ".png")).string());
    const Tensor& want = g.data.tensors.at("resized_" + std::to_string(i));
    const ResizePlan plan = navit_resize(img.height, img.width, cfg);
    ASSERT_EQ(plan.height, want.dim(0));
    ASSERT_EQ(plan.width, want.dim(1));
    const ImageU8 got = resize_bicubic(img, plan.height, plan.width);
    const int32_t* w = want.i32();
    int worst = 0;
    double sum = 0;
    for (size_t k = 0; k < got.rgb.size(); ++k) {
      const int d = std::abs(static_cast<int>(got.rgb[k]) - static_cast<int>(w[k]));
      worst = std::max(worst, d);
      sum += d;
    }
    const double mean = sum / static_cast<double>(got.rgb.size());
    std::cout << "image " << i << " " << img.height << "x" << img.width << " -> " << plan.height
              << "x" << plan.width << ": max diff " << worst << ", mean " << mean << "\n";
    EXPECT_LE(worst, 1);
    EXPECT_LE(mean, 0.01);
  }
}

TEST(ImageGolden, NormalizePatchifyMatchesTransformers) {
  Golden g = load();
  if (g.images == 0) GTEST_SKIP() << "no tests/golden/k25_preprocess";
  const ImageProcessorConfig cfg = golden_config();
  for (int i = 0; i < g.images; ++i) {
    SCOPED_TRACE("image " + std::to_string(i));
    const Tensor& resized = g.data.tensors.at("resized_" + std::to_string(i));
    ImageU8 img{resized.dim(0), resized.dim(1), {}};
    for (int64_t k = 0; k < resized.numel(); ++k)
      img.rgb.push_back(static_cast<uint8_t>(resized.i32()[k]));
    ResizePlan plan = navit_resize(img.height, img.width, cfg);
    // The resized image is the navit size of itself (never upscaled, already within limits).
    ASSERT_EQ(plan.height, img.height);
    ASSERT_EQ(plan.width, img.width);
    std::vector<float> out;
    const ops::ImageGrid grid = normalize_patchify(img, plan, cfg, out);
    const Tensor& thw = g.data.tensors.at("image_grid_thw_" + std::to_string(i));
    EXPECT_EQ(thw.i64()[0], 1);
    EXPECT_EQ(grid.rows, thw.i64()[1]);
    EXPECT_EQ(grid.cols, thw.i64()[2]);
    const Tensor& want = g.data.tensors.at("pixel_values_" + std::to_string(i));
    ASSERT_EQ(static_cast<int64_t>(out.size()), want.numel());
    double worst = 0;
    for (int64_t k = 0; k < want.numel(); ++k)
      worst = std::max(worst,
                       std::abs(static_cast<double>(out[static_cast<size_t>(k)]) - want.f32()[k]));
    EXPECT_LE(worst, 1e-6);
  }
}

}  // namespace
}  // namespace mt::test
