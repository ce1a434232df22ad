#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/arena.h"
#include "core/context.h"
#include "core/seq_info.h"
#include "core/tensor.h"
#include "harness/seed.h"

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

TEST(Core, ColumnViewsAreStridedAndShareMemory) {
  Tensor t = Tensor::empty({4, 5});
  for (int i = 0; i < 20; ++i) t.f32()[i] = static_cast<float>(i);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.strides(), (Shape{5, 1}));
  Tensor c = t.cols(1, 4);
  EXPECT_EQ(c.shape(), Shape({4, 3}));
  EXPECT_EQ(c.stride(0), 5);
  EXPECT_EQ(c.stride(1), 1);
  EXPECT_FALSE(c.is_contiguous());
  EXPECT_EQ(c.f32_strided()[2 * c.stride(0) + 1], 12.0f);
  // Raw access, reshaping and dense-only ops refuse a strided view.
  EXPECT_THROW((void)c.f32(), ShapeError);
  EXPECT_THROW(c.view({12}), ShapeError);
  EXPECT_THROW(expect_shape(c, {4, 3}, "x"), ShapeError);
  expect_dims(c, {4, 3}, "x");
  // Rows of a column view keep its strides; every column is contiguous again.
  Tensor rc = c.rows(1, 3);
  EXPECT_EQ(rc.f32_strided()[0], 6.0f);
  EXPECT_FALSE(rc.is_contiguous());
  EXPECT_TRUE(t.cols(0, 5).is_contiguous());
  EXPECT_TRUE(t.rows(2, 3).cols(1, 4).is_contiguous());  // a single row
  EXPECT_THROW(t.cols(2, 6), ShapeError);
  EXPECT_THROW(Tensor::empty({5}).cols(0, 1), ShapeError);
  // 3-D: the last dimension is sliced, the outer strides stay.
  Tensor u = Tensor::zeros({2, 3, 4}).cols(1, 3);
  EXPECT_EQ(u.strides(), (Shape{12, 4, 1}));
}

// narrow() slices any dimension: a weight block inside its padded buffer (ops/grouped_ffn.h).
TEST(Core, NarrowSlicesAnyDimensionAndSharesMemory) {
  Tensor t = Tensor::empty({2, 5, 6});
  for (int i = 0; i < 60; ++i) t.f32()[i] = static_cast<float>(i);
  Tensor w = t.narrow(1, 0, 3).narrow(2, 0, 4);  // [2, 3, 4] at pitch 6, groups 30 apart
  EXPECT_EQ(w.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(w.strides(), (Shape{30, 6, 1}));
  EXPECT_FALSE(w.is_contiguous());
  EXPECT_EQ(w.f32_strided()[1 * 30 + 2 * 6 + 3], 45.0f);
  Tensor tail = t.narrow(1, 3, 5).narrow(2, 4, 6);  // the other corner
  EXPECT_EQ(tail.f32_strided()[0], 22.0f);
  EXPECT_TRUE(t.narrow(0, 1, 2).is_contiguous());
  EXPECT_THROW(t.narrow(3, 0, 1), ShapeError);
  EXPECT_THROW(t.narrow(1, 4, 6), ShapeError);
  // A dense copy of the block holds exactly its elements.
  const Tensor d = w.clone();
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 4; ++c)
        EXPECT_EQ(d.f32()[(g * 3 + r) * 4 + c], static_cast<float>(g * 30 + r * 6 + c));
}

TEST(Core, CopyFromHandlesStridesOnBothSides) {
  Rng rng(test::test_seed());
  Tensor a = Tensor::empty({6, 7}), b = Tensor::zeros({6, 9});
  for (int64_t i = 0; i < a.numel(); ++i) a.f32()[i] = static_cast<float>(rng.normal());
  Tensor dst = b.cols(5, 9);
  dst.copy_from(a.cols(2, 6));  // strided -> strided
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 9; ++c)
      EXPECT_EQ(b.f32()[r * 9 + c], c >= 5 ? a.f32()[r * 7 + c - 3] : 0.0f) << r << "," << c;
  Tensor dense = Tensor::empty({6, 4});
  dense.copy_from(b.cols(5, 9));  // strided -> contiguous
  EXPECT_EQ(dense.f32()[4 * 4 + 2], a.f32()[4 * 7 + 4]);
  // f32 -> bf16 into a strided view, and back.
  Tensor h = Tensor::zeros({6, 5}, DType::BF16);
  Tensor hv = h.cols(1, 5);
  hv.copy_from(dense);
  Tensor back = Tensor::empty({6, 4});
  back.copy_from(hv);
  for (int64_t i = 0; i < back.numel(); ++i)
    EXPECT_NEAR(back.f32()[i], dense.f32()[i], std::abs(dense.f32()[i]) * 4e-3);
  EXPECT_EQ(h.bf16()[0], 0);  // untouched column
  Tensor wrong = Tensor::empty({4, 6});
  EXPECT_THROW(wrong.copy_from(b.cols(0, 4)), ShapeError);  // strided copies need equal shapes
  b.cols(0, 5).zero_();
  for (int64_t r = 0; r < 6; ++r) EXPECT_EQ(b.f32()[r * 9 + 5], a.f32()[r * 7 + 2]);
  EXPECT_EQ(b.f32()[9 + 4], 0.0f);
}

TEST(Core, Bf16RoundTripIsWithinHalfUlp) {
  Rng rng(test::test_seed());
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
  const uint64_t seed = test::test_seed();
  Rng a(seed), b(seed);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  Rng c(seed, a.counter());
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
  // 7 and 5 standard deviations (1/sqrt(n), sqrt(2/n)): a fresh seed fails them with a
  // probability below 1e-6.
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
