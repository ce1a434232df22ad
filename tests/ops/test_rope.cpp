#include <gtest/gtest.h>

#include "core/seq_info.h"
#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/rope.h"
#include "ref/rope_ref.h"

namespace mt::test {
namespace {

// Positions come from packed documents, so they restart at 0 in each one.
class RopeCase : public OpCase {
 public:
  RopeCase(std::vector<int64_t> lengths, ops::RopeParams p)
      : seq_(SeqInfo::from_lengths(lengths)), p_(p) {
    p_.tokens = seq_.tokens;
  }
  std::string name() const override {
    return cat("rope ", p_.style == ops::RopeStyle::HalfSplit ? "half_split" : "interleaved",
               " heads=", p_.heads, " head_dim=", p_.head_dim, " rot=[", p_.rot_offset, ",+",
               p_.rot_dim, ")");
  }
  std::vector<InputSpec> inputs() const override {
    Tensor pos = seq_.positions;
    return {{.name = "positions",
             .shape = {p_.tokens},
             .dtype = DType::I32,
             .differentiable = false,
             .init = [pos](Rng&, Tensor& t) { t.copy_from(pos); }},
            {.name = "x", .shape = {p_.tokens, p_.heads, p_.head_dim}}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc(in[1].shape());
    ops::rope_forward(ctx, p_, in[0], in[1], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::rope_backward(ctx, p_, in[0], dout[0], grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    const bool half_split = p_.style == ops::RopeStyle::HalfSplit;
    const ops::RopeScaling& s = p_.scaling;
    if (s.factor > 1.f) {
      const DVec f = ref::yarn_inv_freq(p_.rot_dim, p_.theta, s.factor, s.beta_fast, s.beta_slow,
                                        static_cast<double>(s.original_max_positions), s.truncate);
      return {ref::rope_freqs(in[1], in[0], p_.heads, p_.head_dim, p_.rot_offset, f, s.magnitude,
                              half_split)};
    }
    return {ref::rope(in[1], in[0], p_.heads, p_.head_dim, p_.rot_offset, p_.rot_dim, p_.theta,
                      half_split)};
  }

 private:
  SeqInfo seq_;
  ops::RopeParams p_;
};

TEST(Rope, HalfSplitSlice) {
  RopeCase c({9, 23, 5}, {.heads = 3,
                          .head_dim = 22,
                          .rot_offset = 6,
                          .rot_dim = 12,
                          .theta = 10000.f,
                          .style = ops::RopeStyle::HalfSplit});
  check_op(c);
}

TEST(Rope, InterleavedSlice) {
  RopeCase c({9, 23, 5}, {.heads = 3,
                          .head_dim = 22,
                          .rot_offset = 6,
                          .rot_dim = 12,
                          .theta = 10000.f,
                          .style = ops::RopeStyle::Interleaved});
  check_op(c);
}

// MLA layout: the rotary part is the tail of the head.
TEST(Rope, InterleavedTail) {
  RopeCase c({31, 2}, {.heads = 2,
                       .head_dim = 24,
                       .rot_offset = 16,
                       .rot_dim = 8,
                       .theta = 50000.f,
                       .style = ops::RopeStyle::Interleaved});
  check_op(c);
}

TEST(Rope, HalfSplitWholeHead) {
  RopeCase c({1, 40}, {.heads = 5,
                       .head_dim = 16,
                       .rot_offset = 0,
                       .rot_dim = 16,
                       .theta = 10000.f,
                       .style = ops::RopeStyle::HalfSplit});
  check_op(c);
}

// YaRN with the correction range inside the rotated slice (some pairs kept, some interpolated,
// some on the ramp) and a cos/sin magnitude, both styles.
TEST(Rope, YarnMatchesReference) {
  for (ops::RopeStyle style : {ops::RopeStyle::HalfSplit, ops::RopeStyle::Interleaved}) {
    RopeCase c({9, 40}, {.heads = 2,
                         .head_dim = 22,
                         .rot_offset = 6,
                         .rot_dim = 16,
                         .theta = 10000.f,
                         .style = style,
                         .scaling = {.factor = 8.f,
                                     .beta_fast = 32.f,
                                     .beta_slow = 1.f,
                                     .original_max_positions = 64,
                                     .magnitude = 1.21f}});
    check_op(c);
  }
}

// DeepSeek-V3.2's published rope_scaling (dim 64, factor 40, beta 32/1, original context 4096):
// the truncated correction range is pairs [10, 23], so pair 10 and below keep theta^(-2i/64)
// and pairs 23+ are divided by 40; also checked against the double reference with and without
// truncation.
TEST(Rope, YarnDeepseekFrequencies) {
  ops::RopeParams p{
      .rot_dim = 64, .theta = 10000.f, .scaling = {.factor = 40.f, .original_max_positions = 4096}};
  const std::vector<double> f = ops::rope_inv_freq(p);
  ASSERT_EQ(f.size(), 32u);
  for (int i : {0, 5, 10}) EXPECT_NEAR(f[i] / std::pow(10000.0, -i / 32.0), 1.0, 1e-6) << i;
  for (int i : {23, 31}) EXPECT_NEAR(f[i] * 40 / std::pow(10000.0, -i / 32.0), 1.0, 1e-6) << i;
  const double mid = f[16] / std::pow(10000.0, -0.5);  // ramp weight (16 - 10) / 13
  EXPECT_NEAR(mid, 1 - 6.0 / 13 + 6.0 / 13 / 40, 1e-6);
  for (bool truncate : {true, false}) {
    p.scaling.truncate = truncate;
    const DVec want = ref::yarn_inv_freq(64, 10000.0, 40.0, 32.0, 1.0, 4096.0, truncate);
    EXPECT_LE(rel_err(ops::rope_inv_freq(p), want), 1e-12);
  }
  p.scaling.factor = 1.f;  // off: plain frequencies
  const std::vector<double> plain = ops::rope_inv_freq(p);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(plain[i] / std::pow(10000.0, -i / 32.0), 1.0, 1e-12);
}

// y may alias x; the result must match the out-of-place one.
TEST(Rope, InPlaceMatchesOutOfPlace) {
  for (ops::RopeStyle style : {ops::RopeStyle::HalfSplit, ops::RopeStyle::Interleaved}) {
    Context ctx;
    Rng rng(test_seed());
    SeqInfo seq = SeqInfo::from_lengths({7, 12});
    ops::RopeParams p{.tokens = seq.tokens,
                      .heads = 2,
                      .head_dim = 14,
                      .rot_offset = 2,
                      .rot_dim = 10,
                      .style = style};
    Tensor x = Tensor::empty({p.tokens, 2, 14});
    fill_normal(rng, x);
    Tensor y = Tensor::empty(x.shape()), inplace = x.clone();
    ops::rope_forward(ctx, p, seq.positions, x, y);
    ops::rope_forward(ctx, p, seq.positions, inplace, inplace);
    EXPECT_EQ(rel_err(to_dvec(inplace), to_dvec(y)), 0.0);
    ops::rope_backward(ctx, p, seq.positions, inplace, inplace);  // the inverse restores x
    EXPECT_LE(rel_err(to_dvec(inplace), to_dvec(x)), 1e-6);
  }
}

TEST(Rope, SliceOutsideHeadIsAnError) {
  Context ctx;
  ops::RopeParams p{.tokens = 2, .heads = 1, .head_dim = 8, .rot_offset = 4, .rot_dim = 6};
  Tensor pos = Tensor::zeros({2}, DType::I32), x = Tensor::zeros({2, 1, 8}),
         y = Tensor::zeros({2, 1, 8});
  EXPECT_THROW(ops::rope_forward(ctx, p, pos, x, y), ValueError);
}

}  // namespace
}  // namespace mt::test
