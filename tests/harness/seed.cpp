#include "harness/seed.h"

#include <gtest/gtest.h>

#include <chrono>
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

}  // namespace

uint64_t base_seed() {
  static const uint64_t base = read_base();
  return base;
}

uint64_t test_seed() {
  static std::string test;
  static uint64_t drawn = 0;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = info ? cat(info->test_suite_name(), ".", info->name()) : "";
  if (name != test) {
    test = name;
    drawn = 0;
  }
  uint64_t h = base_seed();
  for (char c : name) h = splitmix(h ^ static_cast<unsigned char>(c));
  return splitmix(h + drawn++);
}

std::string seed_note() {
  return cat("MOETRAIN_TEST_SEED=", base_seed());
}

}  // namespace mt::test
