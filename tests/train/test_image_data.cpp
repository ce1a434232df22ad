// Interleaved image-text data (train/image_data.h): packing puts one placeholder per merged patch
// where the image was, targets only on "text" tokens, the images' patches equal the processor's
// own; the dataset round-trips through disk into batches; the four bad inputs are one-line
// errors naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "io/image_file.h"
#include "train/image_data.h"

namespace mt::test {
namespace {

namespace fs = std::filesystem;

fs::path golden_png(int i) {
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); !p.empty(); p = p.parent_path()) {
    fs::path f =
        p / "tests" / "golden" / "k25_preprocess" / ("image_" + std::to_string(i) + ".png");
    if (fs::exists(f, ec)) return f;
    if (p == p.parent_path()) break;
  }
  return {};
}

class ImageData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mt_image_data_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
    png_ = golden_png(1);  // 200 x 60: 10 x 4 patches of 14 under the limits below
    if (png_.empty()) GTEST_SKIP() << "no tests/golden/k25_preprocess";
    fs::copy_file(png_, dir_ / "a.png");
    std::vector<std::string> texts;
    for (int i = 0; i < 50; ++i)
      texts.push_back("what digit is shown in the picture number " + std::to_string(i));
    tok_ = Tokenizer::train(texts, {.vocab = 300, .max_sentences = 1000, .threads = 1});
    opt_.image_token_id = tok_.vocab();  // one past the text vocabulary
    opt_.processor.max_patches = 64;
    opt_.processor.max_side_patches = 10;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string jsonl(const std::string& line) {
    const fs::path p = dir_ / "data.jsonl";
    std::ofstream(p) << line << "\n";
    return p.string();
  }
  fs::path dir_, png_;
  Tokenizer tok_;
  ImageDataOptions opt_;
};

TEST_F(ImageData, PacksPlaceholdersAndTextTargets) {
  const auto docs = read_interleaved(jsonl(
      R"({"content": [{"prompt": "what digit"}, {"image": "a.png"}, {"text": "number 7"}]})"));
  const PackedData d = pack_interleaved(docs, tok_, 64, opt_);
  ASSERT_EQ(d.sequences(), 1);
  const auto prompt = tok_.encode("what digit"), text = tok_.encode("number 7");
  const int64_t P = static_cast<int64_t>(prompt.size()), n = 10 * 4 / 4;
  for (int64_t t = 0; t < 64; ++t) {
    const bool img = t >= P && t < P + n;
    EXPECT_EQ(d.ids[t] == opt_.image_token_id, img) << t;
    // Targets: the text tokens only (predicted from the token before each).
    const int64_t first_text = P + n, end = first_text + static_cast<int64_t>(text.size());
    const bool target = t + 1 >= first_text && t + 1 < end;
    EXPECT_EQ(d.targets[t] != kIgnoreIndex, target) << t;
  }
  ASSERT_TRUE(d.images);
  ASSERT_EQ(d.images->images.size(), 1u);
  // The patches are the processor's own for the decoded file.
  const ImageU8 img = read_image(png_.string());
  const ResizePlan plan = navit_resize(img.height, img.width, opt_.processor);
  std::vector<float> want;
  normalize_patchify(resize_bicubic(img, plan.height, plan.width), plan, opt_.processor, want);
  EXPECT_EQ(d.images->pixels, want);

  write_dataset(d, (dir_ / "ds").string());
  const PackedData back = load_dataset((dir_ / "ds").string());
  const Batch b = make_batch(back, {0});
  ASSERT_EQ(b.images.grids.size(), 1u);
  EXPECT_EQ(b.images.grids[0].rows, 10);
  EXPECT_EQ(b.images.grids[0].cols, 4);
  ASSERT_EQ(b.images.pixels.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(b.images.pixels.f32()[i], want[i]);
}

// Each bad input: the message is one line and names the offending file.
void expect_one_line(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
  }
}

TEST_F(ImageData, BadInputsAreOneLineErrors) {
  auto pack = [&](const std::string& line) {
    return [this, line] { pack_interleaved(read_interleaved(jsonl(line)), tok_, 64, opt_); };
  };
  expect_one_line(pack(R"({"content": [{"image": "missing.png"}, {"text": "x"}]})"), "missing.png");
  std::ofstream(dir_ / "junk.png") << "\x89PNG\r\n\x1a\nnot really a png";
  expect_one_line(pack(R"({"content": [{"image": "junk.png"}, {"text": "x"}]})"), "junk.png");
  opt_.limits.max_pixels = 100;
  expect_one_line(pack(R"({"content": [{"image": "a.png"}, {"text": "x"}]})"), "a.png");
  opt_.limits = {};
  expect_one_line(pack(R"({"content": [{"image": "a.png", "placeholders": 3}, {"text": "x"}]})"),
                  "placeholders");
}

}  // namespace
}  // namespace mt::test
