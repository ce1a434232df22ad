// Checkpoints: a directory holding model.safetensors (every parameter, in its stored dtype),
// optimizer.safetensors (AdamW moments of the trainable parameters by name, and their fp32
// masters when the policy stores them narrower), state.json (step, data cursor, RNG, optimizer
// step, model config), job.toml (the resolved job) and manifest.json (the precision policy, and
// bytes and FNV-1a checksum of every other file, written last). The save is crash-safe: every file
// is written under a temporary name, fsynced and renamed; the directory is written as
// `step_NNNNNNNN.tmp`, synced, then put in place (exchanged with an existing directory of the same
// step, never deleted first); `latest` is replaced by rename; only then is a displaced directory
// deleted. A save killed at any byte therefore leaves `latest` naming a complete checkpoint
// (docs/reliability.md). A save that fails (a full disk) deletes its partial directory and throws
// IoError naming the file; the previous checkpoint is untouched.
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
  std::string precision = "fp32";  // the policy the checkpoint was saved under (load only)
};

// Writes `<root>/step_NNNNNNNN` and points `<root>/latest` at it. `after_file` (tests) runs after
// each file lands in the temporary directory. Returns the checkpoint path. Fault injection:
// train/faults.h.
std::string save_checkpoint(const std::string& root, const Model& model, const AdamW* opt,
                            const TrainState& state, const std::string& job_toml,
                            const std::function<void(const std::string&)>& after_file = {});

class SaveFaults;
// The end of a save whose files are complete in `<root>/<name>.tmp`: sync, put the directory in
// place, point `latest` at it, delete what it displaced (shared with sharded checkpoints).
void commit_checkpoint(const std::string& root, const std::string& name, SaveFaults& faults);

// The checkpoint `<root>/latest` names, or "" when there is none.
std::string latest_checkpoint(const std::string& root);

// Verifies the manifest, checks the checkpoint was written for this model (ConfigError naming
// the first differing config key otherwise), loads weights, and optimizer state when `opt`.
// The model's precision may differ from the checkpoint's (a manifest without one is fp32): values
// convert to the model's dtypes, and trainable parameters come from the fp32 masters where the
// checkpoint kept them, so masters are exact across policies and only frozen weights round (fp32
// to bf16, nearest even; bf16 to fp32 is exact).
TrainState load_checkpoint(const std::string& dir, Model& model, AdamW* opt);

// Loads weights from a checkpoint directory, model directory or .safetensors file. Parameters
// the file lacks must be LoRA adapters (they keep their initialisation: B = 0, a no-op); any other
// missing tensor or shape mismatch is a ConfigError naming the tensor.
void load_weights(const std::string& path, Model& model);

// Deletes all but the newest `keep` checkpoints under root, never the one `latest` names.
void prune_checkpoints(const std::string& root, int64_t keep);

}  // namespace mt
