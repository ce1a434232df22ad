// `moetrain bench decode`: incremental decoding speed (issue 12: generate's tokens/s with the
// single-token KDA kernel and without it). Random weights (tiled, as `bench step`), one prompt of
// `prompt` tokens, then `tokens` greedy single-token steps, twice: KDA's recurrence for the steps
// (the Decoder's default) and the chunked core for every step (DecoderOptions 0). Both runs
// start from the same prompt, so their greedy ids should agree; the result says whether they do.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace mt {

struct DecodeBenchOptions {
  std::string model;  // preset, config.json or HF directory (its config only: weights are random)
  int64_t prompt = 512, tokens = 128;
  std::string precision = "bf16";
  std::string device = "auto";
  double workspace_gib = 2;  // op scratch: the prompt's forward is the largest user
  uint64_t seed = 1;
};

// Runs the benchmark; progress lines go to `log`. Keys: docs/gpu.md ("Decoding").
nlohmann::json run_decode_bench(const DecodeBenchOptions& o, std::ostream& log);

}  // namespace mt
