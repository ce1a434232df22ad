// Shared by the mpirun checks (mpi_train_check, mpi_load_check): the kernel's count of this
// process's resident memory (independent of the engine's own counters), and how a rank runs.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "parallel/comm.h"

namespace mt::test {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
inline int64_t status_bytes(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  MT_CHECK(f, ValueError, "cannot read /proc/self/status");
  char line[256];
  long long kb = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') kb = std::atoll(line + n + 1);
  std::fclose(f);
  MT_CHECK(kb >= 0, ValueError, "no ", field, " in /proc/self/status");
  return static_cast<int64_t>(kb) * 1024;
}

// Resets VmHWM to the current VmRSS, so that VmHWM is the peak from now on.
inline void reset_peak_rss() {
  FILE* clear = std::fopen("/proc/self/clear_refs", "w");
  MT_CHECK(clear && std::fputs("5", clear) >= 0 && std::fclose(clear) == 0, ValueError,
           "cannot reset the peak RSS (/proc/self/clear_refs)");
}

// The main of an mpirun check: arguments parsed (a bad one: exit 2), then `run(world, args)`
// (returning the exit status) on this rank; a rank that throws prints "rank R failed: ..." and
// aborts the job, so no peer can hang. `options(args)`: the world's CommOptions.
template <typename Parse, typename Options, typename Run>
int mpi_main(int argc, char** argv, Parse&& parse, Options&& options, Run&& run) {
  par::MpiRuntime mpi(&argc, &argv);
  decltype(parse(argc, argv)) args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  auto world = mpi.world(options(args));
  int rc = 0;
  try {
    rc = run(*world, args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d failed: %s\n", world->rank(), e.what());
    std::fflush(stderr);
    world->abort(2);
  }
  std::fflush(stdout);
  return rc;
}

}  // namespace mt::test
