#include "train/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "model/json_integer.h"
#include "train/files.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

// An integer of a checkpoint's index.json or state.json: nlohmann's own cast of a float beyond T
// is undefined behaviour (model/json_integer.h), of a fraction a silent truncation.
template <typename T>
T checkpoint_integer(const nlohmann::json& obj, const fs::path& file, const char* key) {
  MT_CHECK(obj.is_object() && obj.contains(key), IoError, file.string(), ": no key '", key, "'");
  const nlohmann::json& v = obj.at(key);
  MT_CHECK(v.is_number() && json_integer_fits<T>(v), IoError, file.string(), ": key '", key,
           "' = ", v.dump(), " is not an integer in range");
  return v.get<T>();
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir, const ModelConfig& cfg) : dir_(dir) {
  const fs::path d = dir;
  MT_CHECK(fs::is_directory(d), IoError, "checkpoint '", dir, "' does not exist");
  MT_CHECK(fs::is_regular_file(d / "manifest.json"), IoError, "checkpoint '", dir,
           "' has no manifest.json (an incomplete save?)");
  const nlohmann::json manifest = nlohmann::json::parse(read_file(d / "manifest.json"));
  for (auto it = manifest.at("files").begin(); it != manifest.at("files").end(); ++it) {
    const fs::path f = d / it.key();
    MT_CHECK(fs::is_regular_file(f), IoError, "checkpoint '", dir, "' lacks ", it.key());
    MT_CHECK(file_checksum(f) == it.value().at("fnv1a64").get<std::string>(), IoError,
             "checkpoint '", dir, "': ", it.key(), " does not match its checksum (corrupted)");
  }
  state_ = nlohmann::json::parse(read_file(d / "state.json"));
  const nlohmann::json& a = state_.at("model_config");
  const nlohmann::json b = cfg.to_json();
  for (auto it = b.begin(); it != b.end(); ++it)
    MT_CHECK(a.contains(it.key()) && a.at(it.key()) == it.value(), ConfigError, "checkpoint '", dir,
             "' was written for another model: ", it.key(), " = ",
             a.contains(it.key()) ? a.at(it.key()).dump() : "absent", " in the checkpoint, ",
             it.value().dump(), " in this model");
  if (fs::is_regular_file(d / "index.json")) {
    const nlohmann::json index = nlohmann::json::parse(read_file(d / "index.json"));
    MT_CHECK(index.value("format", "") == kShardedCheckpointFormat, IoError, "checkpoint '", dir,
             "': index.json is not ", kShardedCheckpointFormat);
    for (auto it = index.at("tensors").begin(); it != index.at("tensors").end(); ++it)
      for (const auto& p : it.value().at("pieces"))
        pieces_[it.key()].push_back({p.at("file").get<std::string>(),
                                     p.at("key").get<std::string>(),
                                     checkpoint_integer<int64_t>(p, d / "index.json", "begin"),
                                     checkpoint_integer<int64_t>(p, d / "index.json", "end")});
  } else {
    // A one-process checkpoint: every tensor is one piece.
    for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
      if (!fs::is_regular_file(d / f)) continue;
      for (const SafetensorsEntry& e : read_safetensors_header((d / f).string())) {
        int64_t n = 1;
        for (int64_t x : e.shape) n *= x;
        pieces_[e.name].push_back({f, e.name, 0, n});
      }
    }
  }
}

CheckpointReader::~CheckpointReader() = default;

const SafetensorsModel& CheckpointReader::file(const std::string& name) const {
  auto f = files_.find(name);
  if (f == files_.end())
    f = files_.emplace(name, std::make_unique<SafetensorsModel>((fs::path(dir_) / name).string()))
            .first;
  return *f->second;
}

void CheckpointReader::read(const std::string& name, int64_t begin, int64_t end, float* out) const {
  auto it = pieces_.find(name);
  MT_CHECK(it != pieces_.end(), ConfigError, "checkpoint '", dir_, "' has no tensor '", name, "'",
           name.rfind("m.", 0) == 0 || name.rfind("v.", 0) == 0
               ? " (optimizer state: trained with other LoRA targets?)"
               : "");
  int64_t covered = 0;
  for (const Piece& p : it->second) {
    const int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.end);
    if (lo >= hi) continue;
    const SafetensorsModel& f = file(p.file);
    MT_CHECK(f.contains(p.key), IoError, "checkpoint '", dir_, "': ", p.file, " lacks ", p.key);
    int64_t n = 1;
    for (int64_t x : f.entry(p.key).shape) n *= x;
    MT_CHECK(n == p.end - p.begin, IoError, "checkpoint '", dir_, "': piece ", p.key, " of ",
             p.file, " holds ", n, " elements, the index says ", p.end - p.begin);
    f.read_range(p.key, lo - p.begin, hi - lo, out + (lo - begin));
    covered += hi - lo;
  }
  MT_CHECK(covered == end - begin, ConfigError, "checkpoint '", dir_, "': tensor '", name,
           "' covers ", covered, " of elements [", begin, ", ", end,
           ") (a checkpoint of another model size?)");
}

TrainState CheckpointReader::train_state() const {
  const fs::path f = fs::path(dir_) / "state.json";
  return {.step = checkpoint_integer<int64_t>(state_, f, "step"),
          .data_cursor = checkpoint_integer<int64_t>(state_, f, "data_cursor"),
          .rng_seed = checkpoint_integer<uint64_t>(state_, f, "rng_seed"),
          .rng_counter = checkpoint_integer<uint64_t>(state_, f, "rng_counter")};
}

int64_t CheckpointReader::optimizer_steps() const {
  return checkpoint_integer<int64_t>(state_, fs::path(dir_) / "state.json", "optimizer_steps");
}

}  // namespace mt
