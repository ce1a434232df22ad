// Image decoding (src/io/image_file.h): PNG in every colour type libpng expands (RGB, RGBA
// composited onto white, grey, palette with tRNS, 16-bit) round-trips exactly; JPEG decodes
// close to what was encoded; a missing, foreign, corrupt or oversized file is a one-line error
// naming the file.
#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/rng.h"
#include "io/image_file.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() /
                     cat("mt_image_file_", std::random_device{}(), "_", std::random_device{}());
  fs::create_directories(d);
  return d;
}

// Writes rows of `channels` samples (8 or 16 bits) with the given PNG colour type.
void write_png(const fs::path& path, int w, int h, int color_type, int depth,
               const std::vector<uint8_t>& data, int row_bytes,
               const std::vector<png_color>& palette = {},
               const std::vector<png_byte>& trans = {}) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_TRUE(f);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), depth,
               color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  if (!trans.empty())
    png_set_tRNS(png, info, trans.data(), static_cast<int>(trans.size()), nullptr);
  png_write_info(png, info);
  for (int y = 0; y < h; ++y)
    png_write_row(png, const_cast<png_bytep>(data.data() + static_cast<size_t>(y * row_bytes)));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

std::vector<uint8_t> random_bytes(size_t n, Rng& rng) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng.next_u64() % 256);
  return v;
}

class ImageFile : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_ = Rng(seed_);
    dir_ = temp_dir();
  }
  void TearDown() override { fs::remove_all(dir_); }
  uint64_t seed_ = 0;
  Rng rng_;
  fs::path dir_;
};

TEST_F(ImageFile, PngColourTypesDecodeToRgb) {
  SCOPED_TRACE(cat("seed ", seed_));
  const int w = 7, h = 5;
  // RGB: exact.
  const std::vector<uint8_t> rgb = random_bytes(w * h * 3, rng_);
  write_png(dir_ / "rgb.png", w, h, PNG_COLOR_TYPE_RGB, 8, rgb, w * 3);
  ImageU8 img = read_image(dir_ / "rgb.png");
  EXPECT_EQ(img.height, h);
  EXPECT_EQ(img.width, w);
  EXPECT_EQ(img.rgb, rgb);
  // RGBA: composited onto white.
  const std::vector<uint8_t> rgba = random_bytes(w * h * 4, rng_);
  write_png(dir_ / "rgba.png", w, h, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba, w * 4);
  img = read_image(dir_ / "rgba.png");
  for (int i = 0; i < w * h; ++i)
    for (int c = 0; c < 3; ++c) {
      const uint8_t a = rgba[i * 4 + 3], v = rgba[i * 4 + c];
      ASSERT_EQ(img.rgb[i * 3 + c], composite_on_white(v, a)) << i;
      // Within rounding of the exact blend.
      EXPECT_NEAR(img.rgb[i * 3 + c], (v * a + 255.0 * (255 - a)) / 255.0, 1.0) << i;
    }
  // Grey: replicated.
  const std::vector<uint8_t> grey = random_bytes(w * h, rng_);
  write_png(dir_ / "grey.png", w, h, PNG_COLOR_TYPE_GRAY, 8, grey, w);
  img = read_image(dir_ / "grey.png");
  for (int i = 0; i < w * h; ++i)
    for (int c = 0; c < 3; ++c) ASSERT_EQ(img.rgb[i * 3 + c], grey[i]) << i;
  // Palette with a transparent entry: index 1 becomes white.
  const std::vector<png_color> pal{{10, 20, 30}, {200, 100, 50}, {0, 255, 0}};
  std::vector<uint8_t> idx(w * h);
  for (uint8_t& b : idx) b = static_cast<uint8_t>(rng_.next_u64() % 3);
  write_png(dir_ / "pal.png", w, h, PNG_COLOR_TYPE_PALETTE, 8, idx, w, pal, {255, 0, 255});
  img = read_image(dir_ / "pal.png");
  for (int i = 0; i < w * h; ++i) {
    const png_color p = idx[i] == 1 ? png_color{255, 255, 255} : pal[idx[i]];
    ASSERT_EQ(img.rgb[i * 3 + 0], p.red) << i;
    ASSERT_EQ(img.rgb[i * 3 + 1], p.green) << i;
    ASSERT_EQ(img.rgb[i * 3 + 2], p.blue) << i;
  }
  // 16-bit RGB: the high byte (libpng's strip_16).
  const std::vector<uint8_t> rgb16 = random_bytes(w * h * 6, rng_);
  write_png(dir_ / "rgb16.png", w, h, PNG_COLOR_TYPE_RGB, 16, rgb16, w * 6);
  img = read_image(dir_ / "rgb16.png");
  for (int i = 0; i < w * h * 3; ++i) ASSERT_EQ(img.rgb[i], rgb16[i * 2]) << i;
}

TEST_F(ImageFile, CompositeOnWhiteEnds) {
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(composite_on_white(static_cast<uint8_t>(c), 255), c);
    EXPECT_EQ(composite_on_white(static_cast<uint8_t>(c), 0), 255);
  }
  EXPECT_EQ(composite_on_white(0, 128), 127);
}

TEST_F(ImageFile, JpegDecodesCloseToTheSource) {
  SCOPED_TRACE(cat("seed ", seed_));
  const int w = 16, h = 8;
  // A smooth gradient survives JPEG at quality 100 within a few levels.
  std::vector<uint8_t> rgb(w * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        rgb[(y * w + x) * 3 + c] = static_cast<uint8_t>(40 + 8 * x + 5 * y + 30 * c);
  const fs::path path = dir_ / "g.jpg";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_TRUE(f);
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 100, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = rgb.data() + cinfo.next_scanline * w * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::fclose(f);
  const ImageU8 img = read_image(path);
  ASSERT_EQ(img.height, h);
  ASSERT_EQ(img.width, w);
  for (size_t i = 0; i < rgb.size(); ++i) EXPECT_NEAR(img.rgb[i], rgb[i], 4) << i;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(ImageFile, BadFilesAreOneLineErrorsNamingTheFile) {
  const std::string missing = (dir_ / "missing.png").string();
  std::string e = error_of([&] { read_image(missing); });
  EXPECT_NE(e.find("IoError"), std::string::npos) << e;
  EXPECT_NE(e.find(missing), std::string::npos) << e;

  const std::string text = (dir_ / "notes.png").string();
  std::ofstream(text) << "not an image at all";
  e = error_of([&] { read_image(text); });
  EXPECT_NE(e.find("not a PNG or JPEG"), std::string::npos) << e;
  EXPECT_NE(e.find(text), std::string::npos) << e;

  // A PNG signature and header, then a truncated stream.
  const std::vector<uint8_t> rgb = random_bytes(30 * 20 * 3, rng_);
  write_png(dir_ / "full.png", 30, 20, PNG_COLOR_TYPE_RGB, 8, rgb, 30 * 3);
  const std::string cut = (dir_ / "cut.png").string();
  {
    std::ifstream in(dir_ / "full.png", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  e = error_of([&] { read_image(cut); });
  EXPECT_NE(e.find("cannot decode PNG"), std::string::npos) << e;
  EXPECT_NE(e.find(cut), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;

  const std::string jpg = (dir_ / "bad.jpg").string();
  std::ofstream(jpg, std::ios::binary) << std::string("\xFF\xD8\xFF\xE0garbage", 11);
  e = error_of([&] { read_image(jpg); });
  EXPECT_NE(e.find("cannot decode JPEG"), std::string::npos) << e;

  // Larger than the configured maximum: refused before its pixels are decoded.
  e = error_of([&] { read_image((dir_ / "full.png").string(), {.max_pixels = 599}); });
  EXPECT_NE(e.find("ValueError"), std::string::npos) << e;
  EXPECT_NE(e.find("maximum 599"), std::string::npos) << e;
  EXPECT_NO_THROW(read_image((dir_ / "full.png").string(), {.max_pixels = 600}));
}

}  // namespace
}  // namespace mt::test
