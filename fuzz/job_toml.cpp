// Fuzz target: a job file (TOML) through Job::parse, its validation, the resolved job's TOML
// (which must parse back to the same text) and the model configuration it names.
#include "fuzz/fuzz_target.h"
#include "train/job.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return mt::fuzz::run_one([&] {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const mt::Job job = mt::Job::parse(text, "fuzz.toml");
    const std::string resolved = job.to_toml();
    if (mt::Job::parse(resolved, "resolved.toml").to_toml() != resolved) {
      std::fprintf(stderr, "fuzz: resolved job does not round-trip:\n%s\n", resolved.c_str());
      std::abort();
    }
    mt::job_model_config(job);
    mt::job_model_options(job);
  });
}
