// safetensors reading and writing (https://huggingface.co/docs/safetensors): one file, or a
// sharded set described by model.safetensors.index.json. Floating tensors (bf16, f16, f32) are
// converted to f32 on load because compute is f32; i32/i64 are kept. Every malformed input is an
// IoError/ShapeError naming the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt {

using TensorMap = std::map<std::string, Tensor>;
using MetadataMap = std::map<std::string, std::string>;

struct SafetensorsData {
  TensorMap tensors;
  MetadataMap metadata;  // the header's "__metadata__" (string values only, per the format)
};

// Header entry of one tensor as stored in the file (before any conversion).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // the format's spelling: "F32", "BF16", "F16", "I32", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

// Parses and validates just the header of one file (cheap: reads 8 + header bytes).
std::vector<SafetensorsEntry> read_safetensors_header(const std::string& path,
                                                      MetadataMap* metadata = nullptr);

// Reads one .safetensors file. Floating tensors become F32; I32/I64 stay; other dtypes
// (bool, u8, f64, fp8...) are an IoError naming the tensor.
SafetensorsData read_safetensors(const std::string& path);

// Reads a directory's weights: model.safetensors.index.json (sharded) if present, else
// model.safetensors, else every *.safetensors in it (sorted; a name in two files is an error).
// `path` may also be a single .safetensors file.
SafetensorsData read_safetensors_model(const std::string& path);

// Writes tensors (stored in their own dtype: F32, BF16, I32, I64) and string metadata
// atomically: a temporary file in the same directory, flushed and fsynced, then renamed over
// `path`. Tensors are laid out in name order with no gaps (the format forbids holes).
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const MetadataMap& metadata = {});

// Writes `tensors` into `dir` as shards of at most `max_shard_bytes` (a tensor larger than that
// gets a shard of its own) named model-00001-of-0000N.safetensors plus
// model.safetensors.index.json; a single shard is written as model.safetensors with no index.
// Each file is written atomically; the index is written last.
void write_safetensors_sharded(const std::string& dir, const TensorMap& tensors,
                               const MetadataMap& metadata = {},
                               uint64_t max_shard_bytes = uint64_t{5} << 30);

}  // namespace mt
