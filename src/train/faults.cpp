#include "train/faults.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "core/error.h"

namespace mt {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int64_t env_int(const char* name, int64_t otherwise) {
  const std::string v = env(name);
  if (v.empty()) return otherwise;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  MT_CHECK(end && *end == '\0', ConfigError, name, " = '", v, "' is not an integer");
  return x;
}

void kill_self(int) {
  ::kill(::getpid(), SIGKILL);
}

}  // namespace

FaultPlan FaultPlan::from_env() {
  FaultPlan p;
  p.kill_at_byte = env_int("MOETRAIN_FAULT_KILL_AT_BYTE", -1);
  p.kill_at = env("MOETRAIN_FAULT_KILL_AT");
  MT_CHECK(p.kill_at.empty() || p.kill_at == "complete" || p.kill_at == "installed" ||
               p.kill_at == "latest",
           ConfigError, "MOETRAIN_FAULT_KILL_AT = '", p.kill_at,
           "' must be complete, installed or latest");
  p.kill_save_step = env_int("MOETRAIN_FAULT_KILL_SAVE_STEP", -1);
  p.enospc_save_step = env_int("MOETRAIN_FAULT_ENOSPC_SAVE_STEP", -1);
  p.nan = env("MOETRAIN_FAULT_NAN");
  MT_CHECK(p.nan.empty() || p.nan == "loss" || p.nan == "grad", ConfigError,
           "MOETRAIN_FAULT_NAN = '", p.nan, "' must be loss or grad");
  p.nan_step = env_int("MOETRAIN_FAULT_NAN_STEP", -1);
  p.nan_rank = static_cast<int>(env_int("MOETRAIN_FAULT_NAN_RANK", 0));
  return p;
}

SaveFaults::SaveFaults(const FaultPlan& plan, int64_t step)
    : active_(plan.kill_save_step < 0 || plan.kill_save_step == step),
      enospc_(plan.enospc_save_step == step),
      kill_at_byte_(plan.kill_at_byte),
      kill_at_(plan.kill_at) {
  if (active_ && kill_at_byte_ >= 0) ::signal(SIGXFSZ, kill_self);
}

SaveFaults::~SaveFaults() {
  disarm();
}

void SaveFaults::before_file(const std::filesystem::path& file) {
  MT_CHECK(!enospc_, IoError, "cannot write '", file.string(),
           "': No space left on device (injected: MOETRAIN_FAULT_ENOSPC_SAVE_STEP)");
  if (!active_ || kill_at_byte_ < 0) return;
  // Already past N (a zero-byte file cannot cross it): die here, at byte N.
  if (written_ >= kill_at_byte_) kill_self(0);
  getrlimit(RLIMIT_FSIZE, &saved_limit_);
  rlimit lim = saved_limit_;
  lim.rlim_cur = static_cast<rlim_t>(kill_at_byte_ - written_);
  setrlimit(RLIMIT_FSIZE, &lim);
  armed_ = true;
}

void SaveFaults::after_file(const std::filesystem::path& written) {
  if (!active_ || kill_at_byte_ < 0) return;
  disarm();
  written_ += static_cast<int64_t>(std::filesystem::file_size(written));
}

void SaveFaults::point(const char* name) const {
  if (active_ && kill_at_ == name) kill_self(0);
}

void SaveFaults::disarm() {
  if (!armed_) return;
  setrlimit(RLIMIT_FSIZE, &saved_limit_);
  armed_ = false;
}

}  // namespace mt
