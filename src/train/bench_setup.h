// What `bench step` and `bench decode` set up alike: the job they run (a model's config with random
// weights, a precision, a device), resolved as `moetrain train` resolves it, and random prompts.
#pragma once

#include <chrono>
#include <string>

#include "core/device.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "model/model.h"
#include "train/job.h"

namespace mt {

// The job's fields both benchmarks take from their options; a caller adds its own (LoRA, ...).
Job bench_job(const std::string& model, const std::string& precision, const std::string& device);

struct BenchModel {
  Device device;
  ModelConfig cfg;
  ModelOptions mopt;  // on `device`, with tiled initialisation (random weights, built fast)
};
// The job's device, model config and options. The CPU computes fp32 only: another precision there
// is a ConfigError naming `bench` ("bench step").
BenchModel bench_model(const Job& job, const char* bench);

// ids[i] for every element: uniform in [3, vocab), past the special ids.
void random_ids(Tensor& ids, int64_t vocab, Rng& rng);

double seconds_since(std::chrono::steady_clock::time_point t0);

}  // namespace mt
