#include "cli/bench_util.h"

#include <algorithm>
#include <chrono>

#include "core/device.h"

namespace mt::cli {

Tensor random_device(const Shape& s, DType dt, Rng& rng, double scale) {
  Tensor d = Tensor::empty(s, dt, Device::CUDA);
  const int64_t n = d.numel(), block = std::min<int64_t>(n, 1 << 20);
  Tensor h = Tensor::empty({block});
  for (int64_t i = 0; i < block; ++i) h.f32()[i] = static_cast<float>(scale * rng.normal());
  Tensor flat = d.view({n});
  for (int64_t b = 0; b < n; b += block) {
    const int64_t e = std::min(n, b + block);
    Tensor part = flat.rows(b, e);
    part.copy_from(h.rows(0, e - b));
  }
  return d;
}

double mean_ms(Context& ctx, int64_t warmup, int64_t iters, const std::function<void()>& f,
               double* host_ms) {
  using clock = std::chrono::steady_clock;
  for (int64_t i = 0; i < warmup; ++i) f();
  ctx.synchronize();
  const auto t0 = clock::now();
  for (int64_t i = 0; i < iters; ++i) f();
  const auto issued = clock::now();
  ctx.synchronize();
  const auto per_run = [&](clock::time_point t) {
    return 1e3 * std::chrono::duration<double>(t - t0).count() / static_cast<double>(iters);
  };
  if (host_ms) *host_ms = per_run(issued);
  return per_run(clock::now());
}

ContextOptions gpu_options(double workspace_gib) {
  return {.device = Device::CUDA,
          .workspace_bytes = static_cast<size_t>(workspace_gib * static_cast<double>(1 << 30))};
}

double used_gib() {
  const DeviceMemory m = device_memory();
  return static_cast<double>(m.total - m.free) / (1 << 30);
}

bool capture_or_report(Context& ctx, const std::function<void()>& f, OpGraph& g,
                       const std::string& error_key, nlohmann::json& out) {
  try {
    g.capture(ctx, f);
  } catch (const Error& e) {
    out[error_key] = e.what();
    return false;
  }
  return true;
}

void count_launches(Context& ctx, const std::function<void()>& f, const std::string& key,
                    nlohmann::json& out) {
  OpGraph g;
  if (!capture_or_report(ctx, f, g, key + "_error", out)) return;
  out[key] = g.nodes().kernels;
  out[key + "_memsets"] = g.nodes().memsets;
}

}  // namespace mt::cli
