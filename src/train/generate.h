// Text generation on one process: prefill the prompt through a Decoder (decode/decode.h), then one
// token per step with greedy, temperature or nucleus (top-p) sampling from a seeded RNG. An
// adapter is just the model's LoRA parameters: load them into the Model before generating.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/context.h"
#include "core/rng.h"
#include "model/model.h"

namespace mt {

struct SamplingOptions {
  int64_t max_new = 64;
  float temperature = 1.f;  // 0: greedy (argmax, ties to the lower id)
  float top_p = 1.f;        // keep the most probable ids whose mass reaches top_p
  uint64_t seed = 0;
  int32_t eos = -1;  // stop after sampling this id; -1: never
};

// Throws ValueError for a negative temperature or top_p outside (0, 1].
void check_sampling(const SamplingOptions& opt);
// One id drawn from logits [vocab] (consumes one uniform draw unless greedy).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, Rng& rng);

// Timings of the last generate(): the prompt's step, then the single-token steps (each samples
// one id from the previous step's logits). The last sampled id is never fed back, so
// decode_steps = generated - 1.
struct GenerateStats {
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;
  int64_t generated = 0, decode_steps = 0;
  double decode_seconds = 0;  // the single-token steps and the sampling between them
  double prompt_tokens_per_s() const {
    return prompt_seconds > 0 ? static_cast<double>(prompt_tokens) / prompt_seconds : 0;
  }
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? static_cast<double>(decode_steps) / decode_seconds : 0;
  }
};

class Generator {
 public:
  explicit Generator(Model& model) : model_(model) {}
  // The new ids (without the prompt); on_token sees each as soon as it is chosen. Ids outside
  // the vocabulary and an empty prompt are ValueErrors. Runs on the model's device (ctx must be
  // there); per token, the logits' copy to the host is the one wait for the device.
  std::vector<int32_t> generate(Context& ctx, const std::vector<int32_t>& prompt,
                                const SamplingOptions& opt,
                                const std::function<void(int32_t)>& on_token = {});
  const GenerateStats& stats() const { return stats_; }

 private:
  Model& model_;
  GenerateStats stats_;
};

}  // namespace mt
