#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/arena.h"
#include "core/context.h"
#include "core/seq_info.h"
#include "core/tensor.h"

namespace mt {
namespace {

TEST(Core, ErrorsCarryPlaceAndValue) {
  Tensor t = Tensor::zeros({2, 3});
  try {
    (void)t.i32();
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("[2,3]"), std::string::npos) << what;
    EXPECT_NE(what.find("tensor.h:"), std::string::npos) << what;
    EXPECT_GT(e.line(), 0);
  }
}

TEST(Core, ViewsAndRowsShareMemory) {
  Tensor t = Tensor::empty({4, 5});
  for (int i = 0; i < 20; ++i) t.f32()[i] = static_cast<float>(i);
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), Shape({2, 5}));
  EXPECT_EQ(r.f32()[0], 5.0f);
  r.f32()[0] = -1.0f;
  EXPECT_EQ(t.f32()[5], -1.0f);
  EXPECT_THROW(t.view({3, 7}), ShapeError);
  EXPECT_THROW(t.rows(3, 5), ShapeError);
}

TEST(Core, Bf16RoundTripIsWithinHalfUlp) {
  Rng rng(7);
  Tensor a = Tensor::empty({1000});
  for (int i = 0; i < 1000; ++i)
    a.f32()[i] = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform(-3, 3)));
  Tensor b = Tensor::empty({1000}, DType::BF16);
  b.copy_from(a);
  Tensor c = Tensor::empty({1000});
  c.copy_from(b);
  for (int i = 0; i < 1000; ++i) {
    float x = a.f32()[i], y = c.f32()[i];
    EXPECT_LE(std::abs(x - y), std::abs(x) * (1.0f / 256.0f)) << x << " -> " << y;
  }
}

TEST(Core, ArenaIsSizedByItsPlan) {
  ArenaPlan plan;
  plan.add({3, 7});
  plan.add({5}, DType::I32);
  plan.add({64, 2});
  Arena arena(plan.bytes(), Device::CPU, "test");
  arena.alloc({3, 7});
  arena.alloc({5}, DType::I32);
  arena.alloc({64, 2});
  EXPECT_EQ(arena.used(), plan.bytes());
  try {
    arena.alloc({1});
    FAIL() << "expected MemoryError";
  } catch (const MemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("'test'"), std::string::npos);
  }
  { ArenaScope scope(arena); }
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.peak(), plan.bytes());
}

TEST(Core, RngIsReproducibleAndForksAreIndependent) {
  Rng a(42), b(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  Rng c(42, a.counter());
  EXPECT_EQ(a.next_u64(), c.next_u64());
  Rng f1 = a.fork(1), f2 = a.fork(2);
  EXPECT_NE(f1.next_u64(), f2.next_u64());
  double mean = 0, var = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    double x = a.normal();
    mean += x / n;
    var += x * x / n;
  }
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.05);
}

TEST(Core, SeqInfoPacksDocuments) {
  SeqInfo s = SeqInfo::from_lengths({3, 1, 4});
  EXPECT_EQ(s.tokens, 8);
  EXPECT_EQ(s.num_seqs, 3);
  const int32_t want_pos[] = {0, 1, 2, 0, 0, 1, 2, 3};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(s.positions.i32()[i], want_pos[i]);
  EXPECT_EQ(s.cu_seqlens.i32()[3], 8);
  EXPECT_THROW(SeqInfo::from_lengths({2, 0}), ValueError);
}

TEST(Core, ContextRejectsNegativeThreads) {
  EXPECT_THROW(Context(ContextOptions{.threads = -1}), ValueError);
}

}  // namespace
}  // namespace mt
