// Interleaved image-text data (docs/formats.md, "Interleaved image-text data"): JSON lines
//   {"content": [{"prompt": "Q: "}, {"image": "img/3.png"}, {"text": "three"}]}
// where "text" parts are trained on, "prompt" parts only condition, and each "image" (a PNG or
// JPEG, relative to the JSONL file) becomes the processor's patches plus one image_token_id
// placeholder per merged patch; placeholders and prompt tokens are never targets. An image part
// may state its "placeholders" count, which must then match the image. One document per packed
// sequence (images cannot straddle sequences), padded with ignored targets.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "io/image_file.h"
#include "model/vision/image_processor.h"
#include "train/dataset.h"

namespace mt {

struct ImageDataOptions {
  int64_t image_token_id = -1;  // < 0: text-only data
  ImageProcessorConfig processor;
  ImageReadLimits limits;  // larger images are refused (one-line ValueError naming the file)
};

struct InterleavedPart {
  enum Kind { Text, Prompt, Image } kind = Text;
  std::string value;          // text, or the image path (resolved)
  int64_t placeholders = -1;  // Image: as stated in the file (-1: not stated)
};
struct InterleavedDoc {
  std::vector<InterleavedPart> parts;
  std::string source;  // file:line
};

// One-line IoErrors naming file:line for malformed lines.
std::vector<InterleavedDoc> read_interleaved(const std::string& file);

// Every image's patches, and for each packed sequence the images it holds, in placeholder order.
struct PackedImages {
  int64_t patch_dim = 0;
  std::vector<float> pixels;  // [patches, patch_dim]
  struct Entry {
    int64_t sequence = 0, rows = 0, cols = 0, first_patch = 0;
  };
  std::vector<Entry> images;  // ordered by sequence
};

PackedData pack_interleaved(const std::vector<InterleavedDoc>& docs, const Tokenizer& tok,
                            int64_t seq_len, const ImageDataOptions& opt);

// DIR/images.bin (f32 pixels) + DIR/images.json; load returns null when DIR has none.
void write_images(const PackedImages& images, const std::string& dir);
std::shared_ptr<const PackedImages> load_images(const std::string& dir);
// The images of `sequences`, packed in that order (the model's ImageBatch).
ImageBatch image_batch(const PackedImages& images, const std::vector<int64_t>& sequences);

}  // namespace mt
