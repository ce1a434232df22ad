// The cache of cuBLASLt matmul plans (descriptors and the heuristic's algorithm) that lt_matmul
// (ops/cuda/blas.cu) keeps in a context's CudaResources: a training step makes ~16K GEMM calls
// over a few hundred shapes, and building a plan costs more than many of the GEMMs it plans.
// Free of CUDA headers (the plan type is a parameter) so that the CPU suite tests it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "core/dtype.h"

namespace mt {

// Everything a plan is built from: the layouts (shapes, leading dimensions, dtypes), the
// transposes and the workspace the heuristic may assume. The compute and scale types are fixed
// (fp32), alpha and beta are host scalars handed to each call, and no epilogue is set, so none of
// them is part of a plan; a field added to the descriptors joins the key.
struct LtKey {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  DType a = DType::F32, b = DType::F32, c = DType::F32;
  bool trans_a = false, trans_b = false;
  size_t workspace_bytes = 0;

  bool operator==(const LtKey&) const = default;
};

struct LtKeyHash {
  size_t operator()(const LtKey& key) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    auto mix = [&h](uint64_t v) {  // splitmix64's finaliser over the running hash
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
      h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
      h ^= h >> 31;
    };
    mix(static_cast<uint64_t>(key.m));
    mix(static_cast<uint64_t>(key.n));
    mix(static_cast<uint64_t>(key.k));
    mix(static_cast<uint64_t>(key.lda));
    mix(static_cast<uint64_t>(key.ldb));
    mix(static_cast<uint64_t>(key.ldc));
    mix(static_cast<uint64_t>(key.a) | static_cast<uint64_t>(key.b) << 8 |
        static_cast<uint64_t>(key.c) << 16 | static_cast<uint64_t>(key.trans_a) << 24 |
        static_cast<uint64_t>(key.trans_b) << 25);
    mix(static_cast<uint64_t>(key.workspace_bytes));
    return static_cast<size_t>(h);
  }
};

// Plans by key, at most `capacity` of them. Grouped GEMMs see a new row count per expert and
// step, so the set of keys grows without bound over a run: a full cache is emptied and refills
// with the shapes in use (clearing costs nothing: a plan owns no resources). Not thread-safe:
// like the rest of a Context, it is used by one thread at a time.
template <class Plan>
class LtPlanCache {
 public:
  explicit LtPlanCache(size_t capacity) : capacity_(capacity) {}

  // The plan for key; on a miss, build(plan) fills a value-initialised plan in place (a plan
  // never moves once built: cuBLASLt descriptors are plain memory, but nothing here relies on
  // copying them). A build that throws leaves no entry. The reference is valid until the next
  // call.
  template <class Build>
  Plan& get(const LtKey& key, Build&& build) {
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    if (plans_.size() >= capacity_) plans_.clear();
    auto it = plans_.try_emplace(key).first;
    try {
      build(it->second);
    } catch (...) {
      plans_.erase(it);
      throw;
    }
    return it->second;
  }

  size_t size() const { return plans_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::unordered_map<LtKey, Plan, LtKeyHash> plans_;
};

}  // namespace mt
