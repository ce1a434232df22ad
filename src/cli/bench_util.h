// What the kernel benchmarks (bench dsa, kda, moe) share: device inputs, timing and launch counts.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/context.h"
#include "core/graph.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace mt::cli {

// A device tensor of `s` in `dt` holding one block of 2^20 standard normal draws (times `scale`)
// over and over: speed does not depend on the values, and a 131072-token q stays cheap to fill.
Tensor random_device(const Shape& s, DType dt, Rng& rng, double scale = 1);

// Mean wall milliseconds of `iters` runs of f after `warmup` untimed ones, the device drained
// before and after.
// `host_ms` (when given): the host's time per run to issue the work, before the wait for the
// device; near the mean the device waited on the host.
double mean_ms(Context& ctx, int64_t warmup, int64_t iters, const std::function<void()>& f,
               double* host_ms = nullptr);

// A benchmark's device context: the GPU with `workspace_gib` of op scratch.
ContextOptions gpu_options(double workspace_gib);

// GiB of device memory in use (total - free), this process's and any other's.
double used_gib();

// Captures `f` into g (core/graph.h); where capture fails, its reason goes to `error_key`.
bool capture_or_report(Context& ctx, const std::function<void()>& f, OpGraph& g,
                       const std::string& error_key, nlohmann::json& out);

// The launches one call of `f` makes (kernel and memset nodes of its CUDA graph, captured and
// not run), or the capture's error under `key` + "_error".
void count_launches(Context& ctx, const std::function<void()>& f, const std::string& key,
                    nlohmann::json& out);

}  // namespace mt::cli
