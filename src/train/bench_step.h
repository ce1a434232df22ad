// The training-step benchmark: one LoRA (or full) training step of a model on one device, timed
// after warm-up, with the figures that compare it with another engine (tokens/s, MFU by the
// planner's FLOP formula, device memory). `moetrain bench step` prints it as JSON; tools/gpu.sh
// runs it next to ../shared/bench/hf_lora_step.py in the same device call (bench/RESULTS.md).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace mt {

struct StepBenchOptions {
  std::string model;  // preset, config.json or HF directory (its config only: weights are random)
  int64_t tokens = 8192;  // one document of this length
  int64_t warmup = 2, steps = 5;
  // LoRA groups (job.h lora.targets); empty: full training.
  std::vector<std::string> lora_targets = {"attention", "kda", "shared_experts", "dense_ffn"};
  int64_t lora_rank = 16;
  float lora_alpha = 32;
  std::string precision = "bf16";
  std::string device = "auto";
  bool deterministic = false;
  int threads = 0;  // CPU threads (0: all hardware threads)
  // Op scratch (Context::workspace): the largest layer backward's temporaries must fit. 0: the
  // planner's estimate for this model and length (plan::predict_memory's workspace term), so a
  // bad estimate fails the run with the arena's name instead of hiding behind a margin.
  double workspace_gib = 0;
  double peak_tflops = 0;  // for MFU; 0: the device's dense bf16 figure when known (H200: 989)
  uint64_t seed = 1;
  // AdamW's learning rate: every step trains on the same batch, so its loss falls (the issue 13
  // check that a DSA model trains at a length) once the rate is large enough to show in a few.
  float lr = 1e-4f;
  // Print the planner's prediction for this model, length and device (cuda unless --device cpu)
  // and stop: nothing is built or allocated, so it runs without a GPU.
  bool plan_only = false;
  // "chunked" (the default: ops/cuda/kda_chunk.cu where it fits) or "direct" (ops/cuda/kda.cu for
  // every KDA core: the step as it ran before the chunked kernels, for issue 12's KDA share).
  std::string kda_kernels = "chunked";
};

// Runs the benchmark; progress lines go to `log`. The result's keys are documented in
// docs/gpu.md ("Step benchmark").
nlohmann::json run_step_bench(const StepBenchOptions& o, std::ostream& log);

}  // namespace mt
