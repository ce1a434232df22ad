#include "train/bench_setup.h"

namespace mt {

Job bench_job(const std::string& model, const std::string& precision, const std::string& device) {
  Job job;
  job.model = model;
  job.precision = precision;
  job.device = device;
  return job;
}

BenchModel bench_model(const Job& job, const char* bench) {
  BenchModel m{
      .device = job_device(job), .cfg = job_model_config(job), .mopt = job_model_options(job)};
  MT_CHECK(m.device != Device::CPU || m.mopt.precision == Precision::fp32(), ConfigError, bench,
           ": precision \"", job.precision, "\" needs a GPU (the CPU computes fp32 only)");
  m.mopt.device = m.device;
  m.mopt.tiled_init = true;
  return m;
}

void random_ids(Tensor& ids, int64_t vocab, Rng& rng) {
  int32_t* p = ids.i32();
  for (int64_t t = 0; t < ids.numel(); ++t) p[t] = static_cast<int32_t>(3 + rng.below(vocab - 3));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace mt
