// Shared by the mpirun checks (mpi_train_check, mpi_load_check, mpi_comm_check): the kernel's
// count of this process's resident memory (independent of the engine's own counters), the run's
// seed (one for the whole world), and how a rank runs.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "harness/seed.h"
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

// The run's seed, the same on every rank: rank 0's base_seed() (MOETRAIN_TEST_SEED when set,
// else fresh), broadcast, because each rank draws its own fresh one. Collective.
inline uint64_t world_seed(par::Comm& world) {
  int64_t s = world.rank() == 0 ? static_cast<int64_t>(base_seed()) : 0;
  world.broadcast(&s, 1, par::Elem::I64, 0);
  return static_cast<uint64_t>(s);
}

// The line a failed check ends with, so that its draw can be repeated.
inline void print_rerun(uint64_t seed) {
  std::fprintf(stderr,
               "this run drew its inputs from MOETRAIN_TEST_SEED=%llu; rerun them: "
               "MOETRAIN_TEST_SEED=%llu ctest -R <test>\n",
               static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::fflush(stderr);
}

// The main of an mpirun check: arguments parsed (a bad one: exit 2), then `run(world, args, seed)`
// (returning the exit status) on this rank, the world's seed drawn for it (world_seed) and
// printed when the check fails (print_rerun); a `run(world, args)` draws its own, if any. A rank
// that throws prints "rank R failed: ..." and aborts the job, so no peer can hang.
// `options(args)`: the world's CommOptions.
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
  constexpr bool seeded = std::is_invocable_v<Run, par::Comm&, decltype(args)&, uint64_t>;
  const uint64_t seed = seeded ? world_seed(*world) : 0;
  int rc = 0;
  try {
    if constexpr (seeded)
      rc = run(*world, args, seed);
    else
      rc = run(*world, args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d failed: %s\n", world->rank(), e.what());
    if (seeded) print_rerun(seed);
    world->abort(2);
  }
  std::fflush(stdout);
  if (seeded && rc != 0 && world->rank() == 0) print_rerun(seed);
  return rc;
}

}  // namespace mt::test
