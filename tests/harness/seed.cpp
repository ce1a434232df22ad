#include "harness/seed.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "core/error.h"

namespace mt::test {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t read_base() {
  if (const char* s = std::getenv("MOETRAIN_TEST_SEED"); s && *s) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s, &end, 10);
    MT_CHECK(end && *end == '\0', ValueError, "MOETRAIN_TEST_SEED='", s,
             "' is not a decimal number");
    return v;
  }
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

// Prints the rerun command under every failed test that drew a seed: a test drawing its own
// inputs with test_seed() needs no trace of its own to be repeatable.
class SeedPrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit SeedPrinter(const std::string* drew) : drew_(drew) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::string name = cat(info.test_suite_name(), ".", info.name());
    if (!info.result()->Failed() || name != *drew_) return;
    // A malformed MOETRAIN_TEST_SEED fails the test from test_seed(); nothing to print then.
    if (const char* s = std::getenv("MOETRAIN_TEST_SEED");
        s && *s && std::string(s).find_first_not_of("0123456789") != std::string::npos)
      return;
    std::printf("%s drew fresh inputs; rerun them: %s ctest -R '^%s$'\n", name.c_str(),
                seed_note().c_str(), name.c_str());
    std::fflush(stdout);
  }

 private:
  const std::string* drew_;  // the last test that called test_seed()
};

std::string running_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info ? cat(info->test_suite_name(), ".", info->name()) : "";
}

}  // namespace

uint64_t base_seed() {
  static const uint64_t base = read_base();
  return base;
}

uint64_t test_seed() {
  static std::string test;
  static uint64_t drawn = 0;
  // Registered by the first draw, so binaries that never draw print nothing extra.
  [[maybe_unused]] static const bool printing = [] {
    ::testing::UnitTest::GetInstance()->listeners().Append(new SeedPrinter(&test));
    return true;
  }();
  const std::string name = running_test();
  if (name != test) {
    test = name;
    drawn = 0;
  }
  uint64_t h = base_seed();
  for (char c : name) h = splitmix(h ^ static_cast<unsigned char>(c));
  return splitmix(h + drawn++);
}

uint64_t case_seed() {
  static std::string test;
  static uint64_t seed = 0;
  static bool drawn = false;
  const std::string name = running_test();
  if (!drawn || name != test) {
    test = name;
    seed = test_seed();
    drawn = true;
  }
  return seed;
}

std::string seed_note() {
  return cat("MOETRAIN_TEST_SEED=", base_seed());
}

}  // namespace mt::test
