#include "model/vision/image_processor.h"

#include <algorithm>
#include <cmath>

namespace mt {

namespace {

void check_image(const ImageU8& img, const char* what) {
  MT_CHECK(img.height > 0 && img.width > 0 &&
               static_cast<int64_t>(img.rgb.size()) == img.height * img.width * 3,
           ValueError, what, ": image ", img.height, "x", img.width, " holds ", img.rgb.size(),
           " bytes, expected height * width * 3");
}

double bicubic(double x) {
  // Pillow's bicubic_filter (a = -0.5), which torchvision's antialiased path reproduces.
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

constexpr int kPrecisionBits = 32 - 8 - 2;

// Taps of each output sample along one axis: first input index and fixed-point weights.
struct AxisCoeffs {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> w;  // [out, ksize]
};

AxisCoeffs axis_coeffs(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  AxisCoeffs c;
  c.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.first.resize(static_cast<size_t>(out));
  c.count.resize(static_cast<size_t>(out));
  c.w.assign(static_cast<size_t>(out * c.ksize), 0);
  std::vector<double> k(static_cast<size_t>(c.ksize));
  for (int64_t o = 0; o < out; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    // Truncation toward zero, as Pillow's (int) casts.
    const int64_t xmin = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t xmax = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in) - xmin;
    double ww = 0;
    for (int64_t x = 0; x < xmax; ++x) {
      const double v = bicubic((static_cast<double>(x + xmin) - center + 0.5) / filterscale);
      k[static_cast<size_t>(x)] = v;
      ww += v;
    }
    for (int64_t x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[static_cast<size_t>(x)] / ww : k[static_cast<size_t>(x)];
      const double s = v * static_cast<double>(1 << kPrecisionBits);
      c.w[static_cast<size_t>(o * c.ksize + x)] = static_cast<int32_t>(v < 0 ? s - 0.5 : s + 0.5);
    }
    c.first[static_cast<size_t>(o)] = xmin;
    c.count[static_cast<size_t>(o)] = xmax;
  }
  return c;
}

uint8_t clip8(int64_t acc) {
  const int64_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// One pass along the rows (horizontal) or the columns (vertical).
ImageU8 resample_axis(const ImageU8& src, int64_t out, bool horizontal) {
  const int64_t in = horizontal ? src.width : src.height;
  const AxisCoeffs c = axis_coeffs(in, out);
  ImageU8 dst;
  dst.height = horizontal ? src.height : out;
  dst.width = horizontal ? out : src.width;
  dst.rgb.resize(static_cast<size_t>(dst.height * dst.width * 3));
  for (int64_t y = 0; y < dst.height; ++y)
    for (int64_t x = 0; x < dst.width; ++x) {
      const int64_t o = horizontal ? x : y;
      const int32_t* w = c.w.data() + o * c.ksize;
      for (int ch = 0; ch < 3; ++ch) {
        int64_t acc = int64_t{1} << (kPrecisionBits - 1);
        for (int64_t k = 0; k < c.count[static_cast<size_t>(o)]; ++k) {
          const int64_t s = c.first[static_cast<size_t>(o)] + k;
          const int64_t idx = horizontal ? (y * src.width + s) : (s * src.width + x);
          acc += static_cast<int64_t>(src.rgb[static_cast<size_t>(idx * 3 + ch)]) * w[k];
        }
        dst.rgb[static_cast<size_t>((y * dst.width + x) * 3 + ch)] = clip8(acc);
      }
    }
  return dst;
}

}  // namespace

ResizePlan navit_resize(int64_t height, int64_t width, const ImageProcessorConfig& cfg) {
  MT_CHECK(height > 0 && width > 0, ValueError, "image size ", height, "x", width,
           " must be positive");
  MT_CHECK(
      cfg.patch_size > 0 && cfg.merge_size > 0 && cfg.max_patches > 0 && cfg.max_side_patches > 0,
      ValueError, "image processor: patch_size, merge_size, max_patches and ",
      "max_side_patches must be positive");
  const int64_t P = cfg.patch_size, side = cfg.max_side_patches * P;
  const double ph = std::max(1.0, static_cast<double>(height / P));
  const double pw = std::max(1.0, static_cast<double>(width / P));
  const double scale = std::min({1.0, std::sqrt(static_cast<double>(cfg.max_patches) / (ph * pw)),
                                 static_cast<double>(side) / static_cast<double>(height),
                                 static_cast<double>(side) / static_cast<double>(width)});
  ResizePlan r;
  r.height = std::min(
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(height) * scale)), side);
  r.width = std::min(std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(width) * scale)),
                     side);
  const int64_t f = P * cfg.merge_size;
  r.pad_height = (f - r.height % f) % f + r.height;
  r.pad_width = (f - r.width % f) % f + r.width;
  return r;
}

ImageU8 resize_bicubic(const ImageU8& img, int64_t height, int64_t width) {
  check_image(img, "resize");
  MT_CHECK(height > 0 && width > 0, ValueError, "resize to ", height, "x", width,
           ": sizes must be positive");
  // Pillow skips a pass whose size does not change (torchvision's output is the same: the
  // kernel at scale 1 is the identity).
  ImageU8 out = img;
  if (width != img.width) out = resample_axis(out, width, /*horizontal=*/true);
  if (height != img.height) out = resample_axis(out, height, /*horizontal=*/false);
  return out;
}

ops::ImageGrid normalize_patchify(const ImageU8& img, const ResizePlan& plan,
                                  const ImageProcessorConfig& cfg, std::vector<float>& out) {
  check_image(img, "normalize_patchify");
  MT_CHECK(img.height == plan.height && img.width == plan.width, ValueError,
           "normalize_patchify: image ", img.height, "x", img.width, " was not resized to ",
           plan.height, "x", plan.width);
  const int64_t P = cfg.patch_size;
  MT_CHECK(plan.pad_height % P == 0 && plan.pad_width % P == 0 && plan.pad_height >= plan.height &&
               plan.pad_width >= plan.width,
           ValueError, "normalize_patchify: padded size ", plan.pad_height, "x", plan.pad_width,
           " is not a patch multiple covering the image");
  const ops::ImageGrid g{plan.pad_height / P, plan.pad_width / P};
  // transformers fuses rescale into normalise: (v - 255 mean) / (255 std).
  std::array<float, 3> m, s;
  for (int c = 0; c < 3; ++c) {
    MT_CHECK(cfg.std[c] > 0.f, ValueError, "image processor std[", c, "] must be positive");
    m[c] = cfg.mean[c] * 255.f;
    s[c] = cfg.std[c] * 255.f;
  }
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>(g.patches() * 3 * P * P));
  float* o = out.data() + base;
  for (int64_t gr = 0; gr < g.rows; ++gr)
    for (int64_t gc = 0; gc < g.cols; ++gc)
      for (int c = 0; c < 3; ++c)
        for (int64_t u = 0; u < P; ++u)
          for (int64_t v = 0; v < P; ++v) {
            const int64_t y = gr * P + u, x = gc * P + v;
            // Padding is value 0 before normalisation, like tvF.pad(fill=0).
            const float px =
                (y < img.height && x < img.width)
                    ? static_cast<float>(img.rgb[static_cast<size_t>((y * img.width + x) * 3 + c)])
                    : 0.f;
            *o++ = (px - m[c]) / s[c];
          }
  return g;
}

ProcessedImages preprocess_images(const std::vector<ImageU8>& images,
                                  const ImageProcessorConfig& cfg) {
  MT_CHECK(!images.empty(), ValueError, "preprocess_images: no images");
  std::vector<float> pixels;
  ProcessedImages r;
  for (size_t i = 0; i < images.size(); ++i) {
    check_image(images[i], "preprocess_images");
    const ResizePlan plan = navit_resize(images[i].height, images[i].width, cfg);
    const ImageU8 resized = resize_bicubic(images[i], plan.height, plan.width);
    r.grids.push_back(normalize_patchify(resized, plan, cfg, pixels));
  }
  const int64_t dim = 3 * cfg.patch_size * cfg.patch_size;
  r.pixel_values = Tensor::empty({static_cast<int64_t>(pixels.size()) / dim, dim});
  std::copy(pixels.begin(), pixels.end(), r.pixel_values.f32());
  return r;
}

}  // namespace mt
