// The one place randomised tests get their seeds. A run draws one base seed (or reads it from
// MOETRAIN_TEST_SEED); each test_seed() call derives a seed from the base, the running test's
// name and how many seeds that test drew before, so a test rerun alone with the printed base
// draws exactly the same inputs, whichever tests ran before it in the process.
#pragma once

#include <cstdint>
#include <string>

namespace mt::test {

// The base seed of this run: MOETRAIN_TEST_SEED when set (decimal), else a fresh random one.
uint64_t base_seed();

// A fresh seed for the running test (see above). A failed test that drew one prints
// "MOETRAIN_TEST_SEED=<base> ctest -R <test>" at its end.
uint64_t test_seed();

// One test_seed() per test, the same at every call within it: for helpers that several parts of a
// test call and that must draw alike each time (one job's data, one temporary model).
uint64_t case_seed();

// "MOETRAIN_TEST_SEED=<base>": what failure messages print so the run can be repeated.
std::string seed_note();

}  // namespace mt::test
