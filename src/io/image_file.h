// Image files -> 8-bit RGB (model/vision/image_processor.h's input), with Debian's libpng and
// libjpeg-turbo. Transparency (an alpha channel or a PNG tRNS chunk) is composited onto white
// with Pillow's integer arithmetic, as transformers' convert_to_rgb does; grey and palette
// images are expanded to RGB; 16-bit PNG samples are reduced to 8 bits.
#pragma once

#include <cstdint>
#include <string>

#include "model/vision/image_processor.h"

namespace mt {

struct ImageReadLimits {
  int64_t max_pixels = int64_t{1} << 26;  // refuse larger images before decoding their pixels
};

// PNG or JPEG, told apart by their signatures. IoError naming the file for a missing or
// unreadable file, an unknown format or a corrupt stream; ValueError naming it when the image
// exceeds limits.max_pixels.
ImageU8 read_image(const std::string& path, const ImageReadLimits& limits = {});

// Pillow's alpha_composite of (r, g, b, a) over opaque white, per channel.
uint8_t composite_on_white(uint8_t c, uint8_t a);

}  // namespace mt
