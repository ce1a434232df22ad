// The name map between HuggingFace checkpoints and the engine's parameters, and model
// directories (config.json + safetensors) in and out.
//
// Engine parameters already carry transformers-v5 names; the differences are layout only:
//  - kimi_linear KDA: HF has one depthwise `conv1d.weight` [3*H*K, 1, w] over concat(q, k, v);
//    the engine has q_conv1d / k_conv1d / v_conv1d [H*K, 1, w] (rows split in that order).
//  - kimi_linear KDA: HF `A_log` is [1, 1, H, 1]; the engine's is [H].
//  - routed experts: the engine keeps the fused v5 layout `mlp.experts.gate_up_proj` [E, 2F, d]
//    (gate rows first) and `mlp.experts.down_proj` [E, d, F]; on load, per-expert checkpoints
//    (`mlp.experts.N.{gate,up,down}_proj.weight`) are accepted and fused.
// moetrain_hybrid directories use the engine names unchanged.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace mt {

// The model's weights (grads = false) or trainable gradients (grads = true; buffers and frozen
// parameters are left out) as HF-named tensors (copies, f32). `model_type` picks the layout.
TensorMap export_hf_tensors(const Model& m, const std::string& model_type, bool grads = false);

// Bytes read so far and in all (the model files' data sections), after each tensor.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

struct ImportOptions {
  // LoRA adapters absent from the checkpoint keep their values (a fresh adapter on a base model).
  bool keep_lora = false;
  ProgressFn progress;
};

// Copies HF-named tensors into the model's parameters. Every name and shape is checked before
// anything is read; every missing, unexpected and mis-shaped tensor is reported in one one-line
// ShapeError naming the tensors and, for files, the shard (tensors of multi-token-prediction
// layers beyond num_hidden_layers are skipped, as transformers does).
void import_hf_tensors(Model& m, const std::string& model_type, const TensorMap& tensors,
                       const std::string& source, const ImportOptions& opt = {});
// The same, streamed: each tensor is read from its (memory-mapped) file when its parameter is
// filled, so memory beyond the model's own holds one tensor at a time.
void import_hf_tensors(Model& m, const std::string& model_type, const SafetensorsModel& st,
                       const std::string& source, const ImportOptions& opt = {});

// Slices of a model's parameters read straight from an HF directory's files, for a rank that
// keeps only its own slice of every tensor (parallel/dist_trainer.h, load_pieces): elements
// [begin, end) of a parameter flattened in single-process coordinates (the declared shape: all
// experts), decoding only the bytes of those elements (FP8: only the scales of their rows'
// blocks) and handing those pages back, so no rank holds more of the files than the slice it
// is copying. Layout changes (fused per-expert tensors, kimi's split conv1d, renames) map ranges
// to the checkpoint tensors they come from. The constructor checks every name and shape as
// import_hf_tensors does, before anything is read. `st` must outlive the reader.
class HfSliceReader {
 public:
  HfSliceReader(const Model& m, const std::string& model_type, const SafetensorsModel& st,
                const std::string& source, const ImportOptions& opt = {});
  ~HfSliceReader();
  HfSliceReader(const HfSliceReader&) = delete;
  HfSliceReader& operator=(const HfSliceReader&) = delete;
  // Fills out[0, end - begin). False (nothing written): the checkpoint has no tensor for `p`,
  // which keeps its value (an adapter, with keep_lora).
  bool read(const Param& p, int64_t begin, int64_t end, float* out) const;
  uint64_t elements_read() const;  // summed over read() calls

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The FP8 block size the config's quantization_config declares (128x128 when it says none).
Fp8Blocks fp8_blocks(const HfConfig& cfg);

struct LoadedModel {
  HfConfig config;
  std::unique_ptr<Model> model;
};

// Reads DIR/config.json and streams DIR's safetensors (single or sharded; bf16, fp16, fp32 or
// block-scaled FP8, dequantised) into a new Model.
LoadedModel load_hf_model(const std::string& dir, const ModelOptions& opt = {},
                          const ProgressFn& progress = {});

// A parameter's f32 value as a fresh tensor of its declared shape, made when its tensor is
// written: an export reads each weight from a checkpoint (and merges its adapter) there, so the
// model it writes may hold placeholders (ModelOptions::defer_weights).
using ParamValues = std::function<Tensor(const Param& p)>;

// Writes DIR/config.json (the original HF config, or the hybrid's own) and the weights as
// safetensors (sharded above `max_shard_bytes`), each file atomically. Streamed: one HF tensor
// (with its per-expert split) is in memory at a time besides the model. `values` (optional)
// replaces the parameters' own values.
void save_hf_model(const Model& m, const HfConfig& cfg, const std::string& dir,
                   uint64_t max_shard_bytes = uint64_t{5} << 30, const ParamValues& values = {});

// transformers' runtime name of an engine parameter or module that maps one-to-one (no
// conv1d fusion or reshape): kimi_linear's forget-gate projections move under forget_gate.
std::string hf_runtime_name(const std::string& model_type, const std::string& engine_name);

// An HfConfig for a model built from a ModelConfig (model_type "moetrain_hybrid").
HfConfig hybrid_hf_config(const ModelConfig& cfg);

// What every command's --model takes: a preset (tiny, small, seed-2.8t), a config.json, or a
// model directory (config.json of any supported model_type, with or without weights).
HfConfig load_model_config(const std::string& name_or_path);
// Whether `path` is a directory holding safetensors weights.
bool has_weights(const std::string& path);

// A progress display for loading: on a terminal one line redrawn in place ("loading DIR
// [#####     ] 52% 1.30/2.50 GB 210.3 MB/s ETA 0:06", the last with the time taken), elsewhere
// a line at each quarter (quiet in logs); both end with the total.
ProgressFn progress_printer(std::ostream& os, const std::string& label, bool tty);

}  // namespace mt
