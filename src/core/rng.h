// Counter-based random numbers: the whole state is (seed, counter), so it can be saved in a
// checkpoint and streams can be split without sharing mutable state.
#pragma once

#include <cmath>
#include <cstdint>

namespace mt {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0x6d6f65747261696eull, uint64_t counter = 0)
      : seed_(seed), counter_(counter) {}

  uint64_t next_u64() { return mix(seed_ ^ mix(counter_++)); }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller; the second value is dropped to keep the state one counter).
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next_u64() % static_cast<uint64_t>(n)); }
  // An independent stream derived from this one's seed.
  Rng fork(uint64_t stream) const { return Rng(mix(seed_ + 0x9e3779b97f4a7c15ull * (stream + 1))); }

  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }

 private:
  static uint64_t mix(uint64_t z) {  // splitmix64 finaliser
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t seed_;
  uint64_t counter_;
};

}  // namespace mt
