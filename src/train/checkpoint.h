// Checkpoints: a directory holding model.safetensors (every parameter), optimizer.safetensors
// (AdamW moments of the trainable parameters, by name), state.json (step, data cursor, RNG,
// optimizer step, model config), job.toml (the resolved job) and manifest.json (bytes and
// FNV-1a checksum of every other file, written last). The directory is written under a temporary
// name and renamed into place, and the run's `latest` pointer is replaced by rename too, so a
// save killed at any point leaves the previous checkpoint intact and still the latest.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/model.h"
#include "train/adamw.h"

namespace mt {

struct TrainState {
  int64_t step = 0;
  int64_t data_cursor = 0;  // sequences consumed
  uint64_t rng_seed = 0, rng_counter = 0;
};

// Writes `<root>/step_NNNNNNNN` and points `<root>/latest` at it. `after_file` (tests) runs after
// each file lands in the temporary directory. Returns the checkpoint path.
std::string save_checkpoint(const std::string& root, const Model& model, const AdamW* opt,
                            const TrainState& state, const std::string& job_toml,
                            const std::function<void(const std::string&)>& after_file = {});

// The checkpoint `<root>/latest` names, or "" when there is none.
std::string latest_checkpoint(const std::string& root);

// Verifies the manifest, checks the checkpoint was written for this model (ConfigError naming
// the first differing config key otherwise), loads weights, and optimizer state when `opt`.
TrainState load_checkpoint(const std::string& dir, Model& model, AdamW* opt);

// Loads weights from a checkpoint directory, model directory or .safetensors file. Parameters
// the file lacks must be LoRA adapters (they keep their initialisation: B = 0, a no-op); any other
// missing tensor or shape mismatch is a ConfigError naming the tensor.
void load_weights(const std::string& path, Model& model);

// Deletes all but the newest `keep` checkpoints under root.
void prune_checkpoints(const std::string& root, int64_t keep);

}  // namespace mt
