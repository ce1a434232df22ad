// `moetrain bench step` on the CPU with the planner's own workspace estimate (no override): the
// estimate must hold every op's scratch at the thread count the context runs, or the step stops
// with the arena's MemoryError. The CPU KDA core's scratch is per thread, so the check runs on
// three threads whatever the machine has.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/seed.h"
#include "train/bench_step.h"

namespace mt {
namespace {

TEST(StepBench, CpuStepFitsThePlannedWorkspaceOnSeveralThreads) {
  std::ostringstream log;
  nlohmann::json j;
  EXPECT_NO_THROW(j = run_step_bench({.model = "tiny",
                                      .tokens = 64,
                                      .warmup = 0,
                                      .steps = 1,
                                      .precision = "fp32",
                                      .device = "cpu",
                                      .threads = 3,
                                      .seed = test::test_seed()},
                                     log))
      << log.str();
  ASSERT_TRUE(j.contains("ms_per_step")) << log.str();
  EXPECT_GT(j["ms_per_step"].get<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
  EXPECT_EQ(j["device"], "cpu (3 threads)");
}

}  // namespace
}  // namespace mt
