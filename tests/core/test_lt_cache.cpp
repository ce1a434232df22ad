// The key and the container of lt_matmul's plan cache (core/cuda/lt_cache.h): host code, tested
// here in every build; the GEMMs that use it are checked against double references on the GPU.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <vector>

#include "core/cuda/lt_cache.h"
#include "core/rng.h"
#include "harness/seed.h"

namespace mt {
namespace {

LtKey random_key(Rng& rng) {
  auto dim = [&rng] { return 1 + rng.below(5000); };
  auto dtype = [&rng] { return rng.below(2) ? DType::BF16 : DType::F32; };
  return {.m = dim(),
          .n = dim(),
          .k = dim(),
          .lda = dim(),
          .ldb = dim(),
          .ldc = dim(),
          .a = dtype(),
          .b = dtype(),
          .c = dtype(),
          .trans_a = rng.below(2) == 1,
          .trans_b = rng.below(2) == 1,
          .workspace_bytes = static_cast<size_t>(1 + rng.below(1 << 26))};
}

// Each field changed alone, so a field left out of operator== or the hash shows up by name.
std::vector<std::pair<const char*, std::function<void(LtKey&)>>> one_field_changes() {
  auto other = [](DType t) { return t == DType::F32 ? DType::BF16 : DType::F32; };
  return {{"m", [](LtKey& k) { ++k.m; }},
          {"n", [](LtKey& k) { ++k.n; }},
          {"k", [](LtKey& k) { ++k.k; }},
          {"lda", [](LtKey& k) { ++k.lda; }},
          {"ldb", [](LtKey& k) { ++k.ldb; }},
          {"ldc", [](LtKey& k) { ++k.ldc; }},
          {"a", [other](LtKey& k) { k.a = other(k.a); }},
          {"b", [other](LtKey& k) { k.b = other(k.b); }},
          {"c", [other](LtKey& k) { k.c = other(k.c); }},
          {"trans_a", [](LtKey& k) { k.trans_a = !k.trans_a; }},
          {"trans_b", [](LtKey& k) { k.trans_b = !k.trans_b; }},
          {"workspace_bytes", [](LtKey& k) { ++k.workspace_bytes; }}};
}

TEST(LtCache, EveryFieldTakesPartInEqualityAndHash) {
  Rng rng(test::test_seed());
  const LtKeyHash hash;
  for (int trial = 0; trial < 20; ++trial) {
    const LtKey base = random_key(rng);
    LtKey same = base;
    EXPECT_EQ(same, base);
    EXPECT_EQ(hash(same), hash(base));
    for (const auto& [name, change] : one_field_changes()) {
      LtKey changed = base;
      change(changed);
      EXPECT_FALSE(changed == base) << name << "; " << test::seed_note();
      // A 64-bit hash collides by chance with probability 2^-64: a repeatable failure here is a
      // field the hash ignores.
      EXPECT_NE(hash(changed), hash(base)) << name << "; " << test::seed_note();
    }
  }
}

// The transposed operand roles of a GEMM and its backward (same m, n, k, other transposes) are
// distinct plans.
TEST(LtCache, TransposesOfOneShapeAreDistinctKeys) {
  const LtKey nn{.m = 7, .n = 7, .k = 7, .lda = 7, .ldb = 7, .ldc = 7};
  LtKey nt = nn, tn = nn;
  nt.trans_b = true;
  tn.trans_a = true;
  EXPECT_FALSE(nt == tn);
  EXPECT_NE(LtKeyHash{}(nt), LtKeyHash{}(tn));
}

struct FakePlan {
  int built_for = -1;  // the key's m, written by the build
};

TEST(LtCache, BuildsOncePerKeyAndHitsReturnThePlan) {
  LtPlanCache<FakePlan> cache(16);
  int builds = 0;
  auto build_for = [&builds](const LtKey& key) {
    return [&builds, &key](FakePlan& p) {
      EXPECT_EQ(p.built_for, -1) << "a build starts from a fresh plan";
      p.built_for = static_cast<int>(key.m);
      ++builds;
    };
  };
  std::vector<LtKey> keys;
  for (int m = 1; m <= 5; ++m) keys.push_back({.m = m, .n = 3, .k = 4});
  std::vector<FakePlan*> first;
  for (const LtKey& k : keys) first.push_back(&cache.get(k, build_for(k)));
  EXPECT_EQ(builds, 5);
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < keys.size(); ++i) {
      FakePlan& p = cache.get(keys[i], build_for(keys[i]));
      EXPECT_EQ(&p, first[i]) << "a hit returns the plan built on the miss, in place";
      EXPECT_EQ(p.built_for, keys[i].m);
    }
  EXPECT_EQ(builds, 5);
  EXPECT_EQ(cache.size(), 5u);
}

TEST(LtCache, AFullCacheEmptiesAndRefills) {
  const size_t cap = 4;
  LtPlanCache<FakePlan> cache(cap);
  int builds = 0;
  auto get = [&](int64_t m) {
    const LtKey key{.m = m};
    return cache.get(key, [&](FakePlan& p) {
      p.built_for = static_cast<int>(m);
      ++builds;
    });
  };
  for (int64_t m = 1; m <= 4; ++m) get(m);
  EXPECT_EQ(cache.size(), cap);
  EXPECT_EQ(get(3).built_for, 3);  // a hit in a full cache keeps it whole
  EXPECT_EQ(builds, 4);
  EXPECT_EQ(get(5).built_for, 5);  // a miss in a full cache starts over
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(builds, 5);
  EXPECT_EQ(get(1).built_for, 1);  // rebuilt
  EXPECT_EQ(builds, 6);
  EXPECT_LE(cache.size(), cap);
}

TEST(LtCache, AFailedBuildLeavesNoEntry) {
  LtPlanCache<FakePlan> cache(8);
  const LtKey key{.m = 2, .n = 2, .k = 2};
  EXPECT_THROW(cache.get(key, [](FakePlan&) { throw std::runtime_error("no algorithm"); }),
               std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
  int builds = 0;
  EXPECT_EQ(cache
                .get(key,
                     [&builds](FakePlan& p) {
                       p.built_for = 2;
                       ++builds;
                     })
                .built_for,
            2);
  EXPECT_EQ(builds, 1) << "the failed key is built again, not served half-built";
}

}  // namespace
}  // namespace mt
