// safetensors reading and writing (https://huggingface.co/docs/safetensors): one file, or a
// sharded set described by model.safetensors.index.json. Floating tensors (bf16, f16, f32) are
// converted to f32 on load because compute is f32; i32/i64 are kept. Every malformed input is an
// IoError/ShapeError naming the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
// (bool, u8, fp8 without the model's scales...) are an IoError naming the tensor.
SafetensorsData read_safetensors(const std::string& path);

// FP8 block scaling as DeepSeek ships V3/V3.2 (quantization_config {"quant_method": "fp8",
// "fmt": "e4m3", "weight_block_size": [128, 128]}): a 2-D F8_E4M3 tensor W [R, C] comes with
// W_scale_inv (F32/BF16, [ceil(R / rows), ceil(C / cols)]) and its value is
// W[i, j] * W_scale_inv[i / rows, j / cols]; blocks at the right and bottom edges may be partial.
struct Fp8Blocks {
  int64_t rows = 128;
  int64_t cols = 128;
};

// The e4m3fn value of one byte (no infinities; 0x7f/0xff are NaN; largest finite 448).
float fp8_e4m3_to_f32(uint8_t b);

// A model's weights opened for streaming: every file memory-mapped and its header validated up
// front (a missing or truncated shard, an FP8 tensor without its scale fail here, before any
// tensor is read), then tensors decoded one at a time. A decoded tensor's file pages are handed
// back to the kernel at once, so reading a whole model holds one tensor at a time, not the files.
// Scale tensors are folded into their FP8 weights and not listed on their own.
class SafetensorsModel {
 public:
  // `path`: as read_safetensors_model takes it (a directory or one .safetensors file).
  explicit SafetensorsModel(const std::string& path, Fp8Blocks fp8 = {});
  ~SafetensorsModel();
  SafetensorsModel(const SafetensorsModel&) = delete;
  SafetensorsModel& operator=(const SafetensorsModel&) = delete;

  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;  // the shard's path
  // The dtype a tensor has once read: F32 for floating tensors (FP8 included), I32/I64 kept.
  DType loaded_dtype(const std::string& name) const;
  // Decodes one tensor (IoError naming it and its file when unknown or unreadable).
  Tensor read(const std::string& name) const;
  // The same into `dst` (contiguous, host, loaded_dtype, as many elements): no staging copy.
  void read_into(const std::string& name, Tensor& dst) const;
  // Elements [begin, begin + count) of a floating tensor, flattened, as f32 into `out`: only
  // their bytes are decoded (FP8: with the scales of their rows' blocks alone) and those pages
  // handed back, so a rank that needs a slice of a tensor never holds the rest of it.
  void read_range(const std::string& name, int64_t begin, int64_t count, float* out) const;
  uint64_t total_bytes() const { return total_bytes_; }  // the data sections' sizes, summed
  size_t file_count() const { return files_.size(); }
  const MetadataMap& metadata() const { return metadata_; }

 private:
  struct File;
  struct Where {
    size_t file = 0;
    size_t entry = 0;
    std::string scale;  // FP8 weights: the scale tensor's name
  };
  void add_file(const std::string& path, const std::vector<std::string>* listed,
                const std::string& index);
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, Where> where_;
  std::map<std::string, Where> scales_;
  MetadataMap metadata_;
  Fp8Blocks fp8_;
  uint64_t total_bytes_ = 0;
};

// Reads a directory's weights: model.safetensors.index.json (sharded) if present, else
// model.safetensors, else every *.safetensors in it (sorted; a name in two files is an error).
// `path` may also be a single .safetensors file. Everything at once: SafetensorsModel streams.
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

// Tensors made one unit at a time (an export at model size): `produce(u)` returns unit u's
// tensors, a fresh allocation each call, and is called twice per unit (shapes first, then the
// data), so at most one unit is in memory. Shards as write_safetensors_sharded; each file is
// written under a temporary name and renamed, the index last. `progress` gets bytes written.
using TensorProducer = std::function<std::vector<std::pair<std::string, Tensor>>(size_t unit)>;
void write_safetensors_streamed(const std::string& dir, size_t units, const TensorProducer& produce,
                                const MetadataMap& metadata = {},
                                uint64_t max_shard_bytes = uint64_t{5} << 30,
                                const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace mt
