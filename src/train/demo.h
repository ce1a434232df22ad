// `moetrain demo`: trains a preset model for a few hundred steps on English text that every
// Debian system carries (/usr/share/common-licenses), byte-level, and reports held-out loss
// before and after. It exercises the whole engine (every layer kind, forward, backward, AdamW)
// on embedded defaults; the full training application (tokenizer, jobs, checkpoints) replaces
// its data path later.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace mt {

struct DemoOptions {
  std::string model = "small";  // preset name or config.json path
  std::string corpus_dir = "/usr/share/common-licenses";
  int64_t steps = 60;
  int64_t batch = 2;
  int64_t seq = 256;
  float lr = 2e-3f;
  int64_t warmup = 10;
  uint64_t seed = 1;
  int threads = 0;
  int64_t eval_windows = 8;
};

struct DemoResult {
  double eval_before = 0, eval_after = 0;
  double first_loss = 0, last_loss = 0;
  double tokens_per_s = 0;
};

DemoResult run_demo(const DemoOptions& opt, std::ostream& log);

}  // namespace mt
