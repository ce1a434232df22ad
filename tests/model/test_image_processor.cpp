// The C++ kimi_k25 image processor (src/model/vision/image_processor.h): the navit sizes as
// transformers computes them, the antialiased bicubic resize against a double-precision
// separable reference (tolerance 1 level of 255: Pillow / torchvision round fixed-point weights
// and the uint8 intermediate between the passes, so a double pipeline differs by at most one
// level; torchvision's uint8 path uses 14-bit rather than Pillow's 22-bit weights, within the
// same one level), and normalise + patchify exactly.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "harness/seed.h"
#include "model/vision/image_processor.h"

namespace mt::test {
namespace {

// Fresh pixels every run from the harness's seed (a failure prints MOETRAIN_TEST_SEED to rerun it;
// the derived seed is in the message too, SCOPED_TRACE at each use).
uint64_t fresh_seed() {
  return test_seed();
}

ImageU8 random_image(int64_t h, int64_t w, uint64_t seed) {
  Rng rng(seed);
  ImageU8 img{h, w, std::vector<uint8_t>(static_cast<size_t>(h * w * 3))};
  for (uint8_t& v : img.rgb) v = static_cast<uint8_t>(rng.next_u64() % 256);
  return img;
}

TEST(ImageProcessor, NavitSizesFollowTransformers) {
  ImageProcessorConfig cfg;
  auto plan = [&](int64_t h, int64_t w) {
    const ResizePlan r = navit_resize(h, w, cfg);
    return std::vector<int64_t>{r.height, r.width, r.pad_height, r.pad_width};
  };
  // Within every budget: kept, padded to multiples of patch * merge = 28.
  EXPECT_EQ(plan(100, 60), (std::vector<int64_t>{100, 60, 112, 84}));
  EXPECT_EQ(plan(5, 3), (std::vector<int64_t>{5, 3, 28, 28}));
  // The patch budget shrinks both sides by sqrt(64 / 1250).
  cfg.max_patches = 64;
  EXPECT_EQ(plan(700, 350), (std::vector<int64_t>{158, 79, 168, 84}));
  cfg.max_patches = 100;
  EXPECT_EQ(plan(1000, 999), (std::vector<int64_t>{140, 140, 140, 140}));
  // The per-side budget (4 patches = 56 pixels) binds the width.
  cfg = {};
  cfg.max_side_patches = 4;
  EXPECT_EQ(plan(30, 200), (std::vector<int64_t>{8, 56, 28, 56}));
  EXPECT_THROW(navit_resize(0, 5, cfg), ValueError);
}

TEST(ImageProcessor, ResizeToTheSameSizeIsExact) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed ", seed, " (rerun: ", seed_note(), ")"));
  const ImageU8 img = random_image(13, 17, seed);
  const ImageU8 out = resize_bicubic(img, 13, 17);
  EXPECT_EQ(out.rgb, img.rgb);
}

TEST(ImageProcessor, ResizeKeepsAConstantImage) {
  ImageU8 img{9, 31, std::vector<uint8_t>(9 * 31 * 3)};
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = static_cast<uint8_t>(40 + 70 * (i % 3));
  for (auto [h, w] : {std::pair<int64_t, int64_t>{4, 12}, {20, 50}, {9, 7}, {3, 31}}) {
    const ImageU8 out = resize_bicubic(img, h, w);
    for (size_t i = 0; i < out.rgb.size(); ++i)
      ASSERT_EQ(out.rgb[i], 40 + 70 * (i % 3)) << h << "x" << w << " at " << i;
  }
}

// Pillow's separable resampling in double precision: the support widens by the scale when
// shrinking; weights are normalised per output sample; the horizontal pass rounds to uint8.
std::vector<double> ref_pass(const std::vector<double>& src, int64_t h, int64_t w, int64_t out,
                             bool horizontal, int64_t& oh, int64_t& ow) {
  auto cubic = [](double x) {
    const double a = -0.5;
    x = std::abs(x);
    if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
  };
  const int64_t in = horizontal ? w : h;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double fs = std::max(1.0, scale);
  oh = horizontal ? h : out;
  ow = horizontal ? out : w;
  std::vector<double> dst(static_cast<size_t>(oh * ow * 3), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    std::vector<std::pair<int64_t, double>> taps;
    double total = 0;
    for (int64_t s = 0; s < in; ++s) {
      const double k = cubic((s + 0.5 - center) / fs);
      if (k != 0.0 && std::abs(s + 0.5 - center) < 2 * fs) {
        taps.push_back({s, k});
        total += k;
      }
    }
    const int64_t other = horizontal ? h : w;
    for (int64_t q = 0; q < other; ++q)
      for (int c = 0; c < 3; ++c) {
        double acc = 0;
        for (auto [s, k] : taps)
          acc +=
              k / total * src[static_cast<size_t>(((horizontal ? q * w + s : s * w + q)) * 3 + c)];
        dst[static_cast<size_t>(((horizontal ? q * ow + o : o * ow + q)) * 3 + c)] =
            std::clamp(std::round(acc), 0.0, 255.0);
      }
  }
  return dst;
}

// Each pass within one level of the double reference on the same input (the fixed-point weights
// and the rounding at a half are the only differences). Compared end to end the bound does not
// hold: a pass-1 pixel one level off moves pass 2's result by up to the sum of its kernel's
// positive weights, past 1.5 at some phases (seed 12724015371932161526 at 50x70: 2 levels). The
// two-pass resize must then be exactly the width pass followed by the height pass.
TEST(ImageProcessor, ResizeMatchesADoubleReferenceWithinOneLevel) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed ", seed, " (rerun: ", seed_note(), ")"));
  const ImageU8 img = random_image(23, 41, seed);
  // `out` (an h x w resize of `in` along one axis) against the reference pass over `in`.
  const auto check_pass = [](const ImageU8& in, const ImageU8& out, bool horizontal,
                             const std::string& what) {
    std::vector<double> src(in.rgb.begin(), in.rgb.end());
    int64_t oh = 0, ow = 0;
    const std::vector<double> ref =
        ref_pass(src, in.height, in.width, horizontal ? out.width : out.height, horizontal, oh, ow);
    ASSERT_EQ(oh, out.height);
    ASSERT_EQ(ow, out.width);
    int exact = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_LE(std::abs(ref[i] - out.rgb[i]), 1.0) << what << " at " << i;
      exact += ref[i] == out.rgb[i];
    }
    EXPECT_GT(exact, static_cast<int>(ref.size() * 9 / 10)) << what;
  };
  for (auto [h, w] : {std::pair<int64_t, int64_t>{10, 15}, {50, 70}, {23, 20}, {7, 41}, {31, 9}}) {
    const std::string what = cat(h, "x", w);
    const ImageU8 out = resize_bicubic(img, h, w);
    ASSERT_EQ(out.height, h);
    ASSERT_EQ(out.width, w);
    const ImageU8 wide = resize_bicubic(img, img.height, w);
    const ImageU8 both = resize_bicubic(wide, h, w);
    if (w != img.width) check_pass(img, wide, true, what + " (width pass)");
    if (h != img.height) check_pass(wide, both, false, what + " (height pass)");
    EXPECT_EQ(out.rgb, both.rgb) << what << ": not the width pass, then the height pass";
  }
}

TEST(ImageProcessor, NormalizePatchifyLayoutAndPadding) {
  ImageProcessorConfig cfg;
  cfg.patch_size = 3;
  cfg.merge_size = 2;
  cfg.mean = {0.5f, 0.4f, 0.3f};
  cfg.std = {0.5f, 0.25f, 0.2f};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed ", seed, " (rerun: ", seed_note(), ")"));
  const ImageU8 img = random_image(7, 5, seed);
  const ResizePlan plan = navit_resize(7, 5, cfg);
  ASSERT_EQ(plan.pad_height, 12);
  ASSERT_EQ(plan.pad_width, 6);
  std::vector<float> out{42.f};  // appended after what is there
  const ops::ImageGrid g = normalize_patchify(img, plan, cfg, out);
  ASSERT_EQ(g.rows, 4);
  ASSERT_EQ(g.cols, 2);
  ASSERT_EQ(out.size(), 1u + 8 * 27);
  EXPECT_EQ(out[0], 42.f);
  for (int64_t y = 0; y < 12; ++y)
    for (int64_t x = 0; x < 6; ++x)
      for (int c = 0; c < 3; ++c) {
        const double v = (y < 7 && x < 5) ? img.rgb[static_cast<size_t>((y * 5 + x) * 3 + c)] : 0.0;
        const double want = (v / 255.0 - cfg.mean[c]) / cfg.std[c];
        const size_t at =
            1 + static_cast<size_t>(((((y / 3) * 2 + x / 3) * 3 + c) * 3 + y % 3) * 3 + x % 3);
        EXPECT_NEAR(out[at], want, 1e-5) << y << "," << x << "," << c;
      }
}

TEST(ImageProcessor, PreprocessPacksImagesInOrder) {
  ImageProcessorConfig cfg;
  cfg.patch_size = 2;
  cfg.max_patches = 16;
  const ProcessedImages p =
      preprocess_images({random_image(8, 8, fresh_seed()), random_image(3, 9, fresh_seed()),
                         random_image(30, 2, fresh_seed())},
                        cfg);
  ASSERT_EQ(p.grids.size(), 3u);
  EXPECT_EQ(p.grids[0].rows, 4);
  EXPECT_EQ(p.grids[0].cols, 4);
  EXPECT_EQ(p.grids[1].rows, 2);
  EXPECT_EQ(p.grids[1].cols, 6);
  int64_t patches = 0;
  for (const ops::ImageGrid& g : p.grids) {
    EXPECT_EQ(g.rows % 2, 0);
    EXPECT_EQ(g.cols % 2, 0);
    patches += g.patches();
  }
  EXPECT_EQ(p.pixel_values.shape(), Shape({patches, 12}));
  EXPECT_THROW(preprocess_images({ImageU8{2, 2, std::vector<uint8_t>(5)}}, cfg), ValueError);
}

}  // namespace
}  // namespace mt::test
