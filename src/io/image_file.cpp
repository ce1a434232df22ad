#include "io/image_file.h"

#include <jpeglib.h>
#include <png.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace mt {

namespace {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<FILE, FileCloser>;

void check_size(const std::string& path, int64_t w, int64_t h, const ImageReadLimits& limits) {
  MT_CHECK(w > 0 && h > 0, IoError, path, ": image has size ", w, "x", h);
  MT_CHECK(w * h <= limits.max_pixels, ValueError, path, ": image ", w, "x", h, " has ", w * h,
           " pixels, more than the configured maximum ", limits.max_pixels);
}

// libpng reports errors through longjmp; the message is kept for the IoError.
struct PngError {
  char message[256] = "corrupt PNG stream";
};

void png_error_fn(png_structp png, png_const_charp msg) {
  auto* e = static_cast<PngError*>(png_get_error_ptr(png));
  std::snprintf(e->message, sizeof(e->message), "%s", msg);
  png_longjmp(png, 1);
}

void png_warning_fn(png_structp, png_const_charp) {}

// Everything the decode writes lives behind a pointer, so that nothing in the function that
// calls setjmp changes between setjmp and libpng's longjmp (such locals would be indeterminate).
struct PngState {
  PngError err;
  std::vector<uint8_t> rgba;
  std::vector<png_bytep> rows;
  int64_t w = 0, h = 0;
};

// false when libpng reported an error; st->w, st->h are set even when the image is too large
// (and nothing else is decoded then).
bool png_decode(png_structp png, png_infop info, FILE* f, int64_t max_pixels, PngState* st) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_init_io(png, f);
  png_read_info(png, info);
  st->w = png_get_image_width(png, info);
  st->h = png_get_image_height(png, info);
  if (st->w <= 0 || st->h <= 0 || st->w * st->h > max_pixels) return true;
  png_set_expand(png);  // palette -> RGB, grey < 8 bits -> 8 bits, tRNS -> alpha
  png_set_strip_16(png);
  png_set_gray_to_rgb(png);
  png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);  // always RGBA
  png_read_update_info(png, info);
  st->rgba.resize(static_cast<size_t>(st->w * st->h * 4));
  st->rows.resize(static_cast<size_t>(st->h));
  for (int64_t y = 0; y < st->h; ++y)
    st->rows[static_cast<size_t>(y)] = st->rgba.data() + y * st->w * 4;
  png_read_image(png, st->rows.data());
  png_read_end(png, nullptr);
  return true;
}

ImageU8 read_png(const std::string& path, FILE* f, const ImageReadLimits& limits) {
  PngState st;
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &st.err, png_error_fn, png_warning_fn);
  MT_CHECK(png, IoError, path, ": cannot initialise libpng");
  png_infop info = png_create_info_struct(png);
  const bool ok = info && png_decode(png, info, f, limits.max_pixels, &st);
  png_destroy_read_struct(&png, &info, nullptr);
  MT_CHECK(ok, IoError, path, ": cannot decode PNG (", st.err.message, ")");
  check_size(path, st.w, st.h, limits);
  ImageU8 img;
  img.height = st.h;
  img.width = st.w;
  img.rgb.resize(static_cast<size_t>(st.w * st.h * 3));
  for (int64_t i = 0; i < st.w * st.h; ++i) {
    const uint8_t a = st.rgba[static_cast<size_t>(i * 4 + 3)];
    for (int c = 0; c < 3; ++c)
      img.rgb[static_cast<size_t>(i * 3 + c)] =
          composite_on_white(st.rgba[static_cast<size_t>(i * 4 + c)], a);
  }
  return img;
}

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = "corrupt JPEG stream";
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void jpeg_quiet(j_common_ptr, int) {}

struct JpegState {
  ImageU8 img;
  int64_t w = 0, h = 0;
};

// As png_decode: false on a libjpeg error, all output behind `st`.
bool jpeg_decode(jpeg_decompress_struct* cinfo, JpegError* err, FILE* f, int64_t max_pixels,
                 JpegState* st) {
  if (setjmp(err->jump)) return false;
  jpeg_create_decompress(cinfo);
  jpeg_stdio_src(cinfo, f);
  jpeg_read_header(cinfo, TRUE);
  st->w = cinfo->image_width;
  st->h = cinfo->image_height;
  if (st->w <= 0 || st->h <= 0 || st->w * st->h > max_pixels) return true;
  cinfo->out_color_space = JCS_RGB;  // grey and YCbCr alike
  jpeg_start_decompress(cinfo);
  st->img.rgb.resize(static_cast<size_t>(st->w * st->h * 3));
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = st->img.rgb.data() + static_cast<int64_t>(cinfo->output_scanline) * st->w * 3;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

ImageU8 read_jpeg(const std::string& path, FILE* f, const ImageReadLimits& limits) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.emit_message = jpeg_quiet;
  JpegState st;
  const bool ok = jpeg_decode(&cinfo, &err, f, limits.max_pixels, &st);
  jpeg_destroy_decompress(&cinfo);
  MT_CHECK(ok, IoError, path, ": cannot decode JPEG (", err.message, ")");
  check_size(path, st.w, st.h, limits);
  st.img.height = st.h;
  st.img.width = st.w;
  return std::move(st.img);
}

}  // namespace

uint8_t composite_on_white(uint8_t c, uint8_t a) {
  // Pillow's ImagingAlphaComposite with an opaque destination (255, 255, 255, 255):
  // 7-bit coefficients and its shift-based division by 255.
  constexpr uint32_t kBits = 7;
  const uint32_t blend = 255u * (255u - a);
  const uint32_t outa255 = a * 255u + blend;
  const uint32_t coef1 = a * 255u * 255u * (1u << kBits) / outa255;
  const uint32_t coef2 = 255u * (1u << kBits) - coef1;
  const uint32_t tmp = c * coef1 + 255u * coef2 + (0x80u << kBits);
  return static_cast<uint8_t>((((tmp >> 8) + tmp) >> 8) >> kBits);
}

ImageU8 read_image(const std::string& path, const ImageReadLimits& limits) {
  File f(std::fopen(path.c_str(), "rb"));
  MT_CHECK(f, IoError, path, ": cannot open image (", std::strerror(errno), ")");
  unsigned char sig[8] = {};
  const size_t n = std::fread(sig, 1, sizeof(sig), f.get());
  std::rewind(f.get());
  if (n == 8 && png_sig_cmp(sig, 0, 8) == 0) return read_png(path, f.get(), limits);
  if (n >= 3 && sig[0] == 0xFF && sig[1] == 0xD8 && sig[2] == 0xFF)
    return read_jpeg(path, f.get(), limits);
  MT_THROW(IoError, path, ": not a PNG or JPEG file");
}

}  // namespace mt
