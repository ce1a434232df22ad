// Reading a checkpoint of either layout (one process: checkpoint.h; a mesh: the sharded layout of
// dist_executor.h) range by range, in single-process coordinates, without loading its files:
// each file is memory-mapped (SafetensorsModel) on first use, and only the bytes of the ranges
// asked for are decoded and then handed back to the kernel. A reader therefore holds what its
// caller copies out, never the files, which is what lets a rank resume its slices and an export
// write a model larger than the memory left beside it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/model_config.h"
#include "train/checkpoint.h"

namespace mt {

inline constexpr const char* kShardedCheckpointFormat = "moetrain-sharded-1";

class CheckpointReader {
 public:
  // Verifies the manifest (every file present, its checksum) and that the checkpoint was written
  // for `cfg` (ConfigError naming the first differing key).
  CheckpointReader(const std::string& dir, const ModelConfig& cfg);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // Whether the checkpoint holds tensor `name` ("m."/"v."/"master." prefixes for the optimizer's).
  bool contains(const std::string& name) const { return pieces_.count(name) != 0; }
  // Elements [begin, end) of the flattened full tensor `name`, as f32 into out[0, end - begin).
  void read(const std::string& name, int64_t begin, int64_t end, float* out) const;

  TrainState train_state() const;
  int64_t optimizer_steps() const;

 private:
  struct Piece {
    std::string file, key;
    int64_t begin, end;
  };
  const SafetensorsModel& file(const std::string& name) const;
  std::string dir_;
  nlohmann::json state_;
  std::map<std::string, std::vector<Piece>> pieces_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsModel>> files_;
};

}  // namespace mt
