// A training job: everything a run needs, read from TOML. Every key is known here; an unknown key
// or a value of the wrong type is a ConfigError naming the key and the file. `--set a.b=value`
// overrides apply before validation, with the value parsed as TOML (strings may omit quotes).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/model.h"
#include "parallel/balance/train_balancer.h"

namespace mt {

// LoRA target groups and what they cover (full parameter names):
//   attention       model.layers.*.self_attn.* of dsa/mla layers (q/kv/o/gate, indexer projections)
//   kda             model.layers.*.self_attn.* of kda layers (q/k/v, f/g/b gates, o)
//   shared_experts  model.layers.*.mlp.shared_experts.*, mlp.latent_{down,up}_proj
//   routed_experts  model.layers.*.mlp.experts.* (per-expert adapters)
//   dense_ffn       model.layers.*.mlp.{gate,up,down}_proj of dense FFN layers
//   router          model.layers.*.mlp.gate.weight, trained in full (a router has no adapter)
//   vision_projector  model.mm_projector.{in,out}_proj (kimi_k25's multimodal projector)
//   vision_tower    model.vision_tower.layers.*.{attn.{q,k,v}_proj,attn.proj,mlp.fc1,mlp.fc2}
struct LoraGroup {
  int64_t rank = 0;
  float alpha = 0;
};

struct Job {
  // [run]
  std::string run_dir = "runs/run";
  uint64_t seed = 1;
  int threads = 0;
  // Where the step runs: "cpu", "cuda" (GPU 0; a mesh takes one GPU per rank) or "auto" (a GPU
  // when this binary has the CUDA backend and one is visible, else the CPU).
  std::string device = "auto";
  // Bit-repeatable GPU runs (fixed reduction orders; slower). No effect on the CPU, which is
  // deterministic already.
  bool deterministic = false;
  // [model]
  std::string model = "small";  // preset, config.json or HF model directory (its config)
  // An HF model directory (config.json + safetensors): the model and, unless `init` says
  // otherwise, its starting weights (streamed; FP8 dequantised). Sets `model` to the same path.
  std::string model_dir;
  std::string init;  // checkpoint (or weights directory) to start from
  // Precision policy (model/precision.h): "fp32" (the CPU engine) or "bf16" (bf16 weights and
  // activations, fp32 masters and moments; the CPU engine refuses it).
  std::string precision = "fp32";
  // kimi_k25 models: whether the vision tower's weights train. "auto" follows the base (frozen
  // under LoRA, trained in full training), "train" trains them in full (also under LoRA),
  // "freeze" keeps them fixed (also in full training; LoRA adapters on the tower still train).
  std::string vision_tower = "auto";
  // [data]
  std::string train_data;                        // prepared dataset directory
  std::map<std::string, std::string> eval_data;  // corpus name -> prepared dataset directory
  int64_t eval_sequences = 0;                    // per corpus; 0 = all
  // [lora]
  std::vector<std::string> lora_targets;  // empty: full training
  int64_t lora_rank = 8;
  float lora_alpha = 16;
  std::map<std::string, LoraGroup> lora_groups;  // per-target overrides
  std::vector<std::string> train_patterns;       // base parameters (globs) trained in full
  // [optim]
  float lr = 1e-3f, min_lr_ratio = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f,
        weight_decay = 0.01f;
  double clip = 1.0;
  // [schedule]
  int64_t steps = 100, warmup = 10;
  // [train]
  int64_t batch = 2, grad_accum = 1;
  // A NaN/Inf loss or gradient norm, found before the optimizer step: "stop" (the run ends with an
  // error; the last checkpoint stays the latest) or "skip" (the step is not applied, counted in
  // metrics as skipped_steps; the data and schedule move on).
  std::string nonfinite = "stop";
  // What backward recomputes instead of keeping (ActivationRecompute, model/model.h): "none",
  // "selective" (the FFN / MoE internals) or "full" (each layer from its input).
  std::string recompute = "none";
  // [kernels] The routed experts' grouped GEMM configuration on the GPU (ops/grouped_matmul.h's
  // names, e.g. "coop128x256c2x1:down=coop128x256c2x1"; docs/gpu.md); empty:
  // MOETRAIN_GROUPED_GEMM's or the default. No effect on the CPU.
  std::string grouped_gemm;
  // Which CUDA kernels run the KDA cores (ops/kda.h, parse_kda_kernels): "default", or the
  // choices that differ from it, e.g. "keep_prepared=on:forward_overlap_waves=on". No effect on
  // the CPU.
  std::string kda_kernels = "default";
  // [checkpoint]
  int64_t checkpoint_every = 0;  // 0: only at the end
  int64_t checkpoint_keep = 2;
  // A save that fails (a full disk, an unwritable directory): "stop" (the run ends with the
  // IoError) or "continue" (logged and counted in metrics; the next save tries again). Either
  // way the previous checkpoint stays complete and the latest.
  std::string checkpoint_on_error = "stop";
  // [parallel] (used under mpirun; see docs/parallelism.md)
  int64_t ep = 1;              // expert-parallel size: divides the world and the expert count
  int64_t a2a_chunks = 1;      // all-to-all pieces pipelined with the expert computation
  bool shard_experts = false;  // also shard expert optimizer state over the EDP replicas
  // ZeRO-3 for the routed experts: each EDP replica keeps 1/replicas of its experts' values,
  // gradients and moments; a layer's experts are gathered around its use (implies shard_experts).
  bool shard_expert_weights = false;
  bool fsdp = false;  // ZeRO-3 units: dense parameters live as 1/world shards
  // "manual": the keys above; "auto": the planner chooses ep, a2a_chunks, shard_experts,
  // shard_expert_weights, fsdp, train.recompute and the per-rank micro-batch (batch x grad_accum
  // kept) for the world the job runs on.
  std::string plan = "manual";
  double mem_gb = 0;  // per-rank memory limit of plan = "auto"; 0: host memory / ranks
  // Longest wait for one collective before the rank reports the peers that failed and the job
  // ends (par::Comm's watchdog).
  double comm_timeout_s = 300;
  // [balance] (docs/load-balancing.md, "In training"): every part off by default.
  balance::BalanceOptions balance;
  // [log]
  int64_t log_every = 1, eval_every = 0;
  std::string progress = "auto";  // auto | tty | plain | off

  // Reads `path` with overrides ("key=value"). Validates ranges.
  static Job load(const std::string& path, const std::vector<std::string>& overrides = {});
  static Job parse(const std::string& toml_text, const std::string& source,
                   const std::vector<std::string>& overrides = {});
  std::string to_toml() const;  // the resolved job, every key, loadable by parse()
};

// The model configuration with the job's LoRA adapters switched on, and the options saying which
// parameters train. A lora.targets entry or lora.train glob that selects no parameter of the model
// is a ConfigError.
ModelConfig job_model_config(const Job& job);
// Throws ConfigError naming `source` unless every entry of `targets` is a LoRA group that
// lora.targets accepts (attention, kda, shared_experts, routed_experts, ...).
void check_lora_targets(const std::vector<std::string>& targets, const std::string& source);
ModelOptions job_model_options(const Job& job);
// run.device resolved on this machine: "auto" is a GPU when one is visible to a CUDA build;
// "cuda" without one is a ConfigError saying why.
Device job_device(const Job& job);
// "none" | "selective" | "full" -> the model's policy (ConfigError naming `key` otherwise).
ActivationRecompute parse_activation_recompute(const std::string& s, const std::string& key);

// The LoRA target group a parameter belongs to ("" for embeddings, norms, the LM head).
std::string lora_group_of(const ModelConfig& cfg, const std::string& name);
// The alpha the job gives that group's adapters.
float lora_alpha_of(const Job& job, const std::string& group);

// Shell-style glob over a parameter name: '*' any run of characters, '?' one character.
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace mt
