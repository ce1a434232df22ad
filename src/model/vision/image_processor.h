// transformers' Kimi_K25ImageProcessor in C++, for decoded 8-bit RGB images:
//   1. navit_resize: the largest size within max_patches patches and max_side_patches per side
//      (never upscaled), then padding (bottom / right, value 0) to a multiple of
//      patch_size * merge_size;
//   2. resize: bicubic with antialiasing (torchvision's tvF.resize on uint8, which follows
//      Pillow's separable resampling: horizontal pass, uint8 intermediate, vertical pass, 22-bit
//      fixed-point weights). Identical sizes pass through unchanged;
//   3. normalise: (v / 255 - mean) / std per channel (padding included);
//   4. patchify: raster-ordered patches, each flattened (channel, row, col) - pixel_values
//      [patches, 3 * patch^2] and one (rows, cols) grid per image, as the tower reads them.
// Compositing transparency onto white (do_convert_rgb) belongs to decoding (io/image_file.h).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/vision_grid.h"

namespace mt {

// Interleaved 8-bit RGB, rows top to bottom.
struct ImageU8 {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]
};

struct ImageProcessorConfig {
  int64_t patch_size = 14, merge_size = 2;
  int64_t max_patches = 16384;
  int64_t max_side_patches = 512;  // transformers' size.max_height (counted in patches)
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f}, std{0.5f, 0.5f, 0.5f};
};

struct ResizePlan {
  int64_t height = 0, width = 0;          // after resize
  int64_t pad_height = 0, pad_width = 0;  // after padding: multiples of patch * merge
};

ResizePlan navit_resize(int64_t height, int64_t width, const ImageProcessorConfig& cfg);

// Antialiased bicubic resampling (Pillow's filter, a = -0.5, support scaled when shrinking).
ImageU8 resize_bicubic(const ImageU8& img, int64_t height, int64_t width);

// Pads `img` (already resized to plan.height x plan.width) to the plan's padded size, normalises
// and appends its patches to `out` (row-major [patches, 3 * patch^2]); returns its grid.
ops::ImageGrid normalize_patchify(const ImageU8& img, const ResizePlan& plan,
                                  const ImageProcessorConfig& cfg, std::vector<float>& out);

struct ProcessedImages {
  Tensor pixel_values;  // f32 [total patches, 3 * patch^2]
  std::vector<ops::ImageGrid> grids;
};

// All four steps over a batch, images packed in order.
ProcessedImages preprocess_images(const std::vector<ImageU8>& images,
                                  const ImageProcessorConfig& cfg);

}  // namespace mt
