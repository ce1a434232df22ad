#include <gtest/gtest.h>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/grouped_ffn.h"
#include "ref/moe_ref.h"

namespace mt::test {
namespace {

struct FfnSetup {
  int64_t rows = 0, experts = 0, in = 0, ffn = 0, rank = 0;
  float alpha = 16.f;
  bool frozen_base = false;
  // GroupedFfnParams::weight_grads_zero: the base weights' grads are then written (the harness
  // pre-fills written grads with NaN, so a read of them shows).
  bool weight_grads_zero = false;
  bool keep_h = false;  // GroupedFfnParams::keep_h
  // GroupedFfnParams::interleaved_gate_up: gate_up_proj is drawn in the interleaved layout, which
  // the reference reads back as [g | u] (interleaved_source).
  bool interleaved = false;
};

// The [g | u] row of an interleaved gate/up weight's row p (blocks of 16: gate block b at rows
// 32 b .., its up block at 32 b + 16 ..), written out here rather than taken from the op's rule.
int64_t interleaved_source(int64_t p, int64_t F) {
  const int64_t block = p / 32, i = p % 32;
  return i < 16 ? block * 16 + i : F + block * 16 + (i - 16);
}

// Row counts per expert with every third expert (1, 4, 7, ...) empty.
void draw_offsets(Rng& rng, Tensor& t, int64_t rows) {
  const int64_t E = t.numel() - 1;
  std::vector<int32_t> cnt(static_cast<size_t>(E), 0);
  std::vector<int64_t> pool;
  for (int64_t e = 0; e < E; ++e)
    if (e % 3 != 1) pool.push_back(e);
  for (int64_t r = 0; r < rows; ++r) ++cnt[pool[rng.below(static_cast<int64_t>(pool.size()))]];
  int32_t* o = t.i32();
  o[0] = 0;
  for (int64_t e = 0; e < E; ++e) o[e + 1] = o[e] + cnt[e];
}

class GroupedFfnCase : public OpCase {
 public:
  explicit GroupedFfnCase(FfnSetup s) : s_(s) {}
  std::string name() const override {
    return cat("grouped_ffn N", s_.rows, " E", s_.experts, " l", s_.in, " F", s_.ffn, " r", s_.rank,
               s_.frozen_base ? " frozen" : "", s_.weight_grads_zero ? " dW written" : "",
               s_.keep_h ? " h kept" : "", s_.interleaved ? " interleaved" : "");
  }
  ops::GroupedFfnParams params() const {
    return {.rows = s_.rows,
            .experts = s_.experts,
            .in = s_.in,
            .ffn = s_.ffn,
            .lora_rank = s_.rank,
            .lora_alpha = s_.alpha,
            .weight_grads_zero = s_.weight_grads_zero,
            .keep_h = s_.keep_h,
            .interleaved_gate_up = s_.interleaved};
  }
  std::vector<InputSpec> inputs() const override {
    const int64_t E = s_.experts, l = s_.in, F = s_.ffn, r = s_.rank, N = s_.rows;
    const bool base = !s_.frozen_base;
    std::vector<InputSpec> in{{.name = "x", .shape = {N, l}},
                              {.name = "offsets",
                               .shape = {E + 1},
                               .dtype = DType::I32,
                               .differentiable = false,
                               .init = [N](Rng& rng, Tensor& t) { draw_offsets(rng, t, N); },
                               .host = true},
                              {.name = "gate_up_proj",
                               .shape = {E, 2 * F, l},
                               .differentiable = base,
                               .accumulate = !s_.weight_grads_zero,
                               .scale = 0.4},
                              {.name = "down_proj",
                               .shape = {E, l, F},
                               .differentiable = base,
                               .accumulate = !s_.weight_grads_zero,
                               .scale = 0.3}};
    if (r > 0) {
      in.push_back(
          {.name = "gate_up_lora_A", .shape = {E, r, l}, .accumulate = true, .scale = 0.3});
      in.push_back(
          {.name = "gate_up_lora_B", .shape = {E, 2 * F, r}, .accumulate = true, .scale = 0.1});
      in.push_back({.name = "down_lora_A", .shape = {E, r, F}, .accumulate = true, .scale = 0.3});
      in.push_back({.name = "down_lora_B", .shape = {E, l, r}, .accumulate = true, .scale = 0.1});
    }
    return in;
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  static ops::GroupedFfnWeights pack(const std::vector<Tensor>& t, bool lora) {
    ops::GroupedFfnWeights w{.gate_up = t[2], .down = t[3]};
    if (lora) {
      w.gate_up_a = t[4];
      w.gate_up_b = t[5];
      w.down_a = t[6];
      w.down_b = t[7];
    }
    return w;
  }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    const auto p = params();
    saved_.gate_up = alloc({p.rows, 2 * p.ffn});
    if (p.lora_rank > 0) {
      saved_.xa = alloc({p.rows, p.lora_rank});
      saved_.ha = alloc({p.rows, p.lora_rank});
      saved_.h = alloc({p.rows, p.ffn});
    } else if (p.keep_h) {
      saved_.h = alloc({p.rows, p.ffn});
    }
    Tensor y = alloc({p.rows, p.in});
    ops::grouped_ffn_forward(ctx, p, in[0], in[1], pack(in, s_.rank > 0), y, saved_);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::GroupedFfnWeights g = pack(grads, s_.rank > 0);
    ops::grouped_ffn_backward(ctx, params(), in[0], in[1], pack(in, s_.rank > 0), saved_, dout[0],
                              grads[0], g);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    const int64_t E = s_.experts, l = s_.in;
    ref::ExpertRefDims d{
        .experts = E, .in = l, .ffn = s_.ffn, .lora_rank = s_.rank, .lora_alpha = s_.alpha};
    // The reference's [g | u] rows (of gate_up_proj [E, 2F, l] and gate_up_lora_B [E, 2F, r])
    // from the interleaved ones.
    const auto halves = [&](const DVec& v, int64_t width) {
      if (!s_.interleaved) return v;
      const int64_t F = s_.ffn, rows = 2 * F;
      DVec h(v.size());
      for (int64_t e = 0; e < E; ++e)
        for (int64_t p = 0; p < rows; ++p)
          std::copy_n(&v[(e * rows + p) * width], width,
                      &h[(e * rows + interleaved_source(p, F)) * width]);
      return h;
    };
    const DVec gate_up = halves(in[2], l);
    const DVec gate_up_b = s_.rank > 0 ? halves(in[5], s_.rank) : DVec();
    ref::ExpertRefWeights w{.gate_up = &gate_up, .down = &in[3]};
    if (s_.rank > 0) {
      w.gate_up_a = &in[4];
      w.gate_up_b = &gate_up_b;
      w.down_a = &in[6];
      w.down_b = &in[7];
    }
    DVec y(static_cast<size_t>(s_.rows * l));
    for (int64_t e = 0; e < E; ++e)
      for (auto i = static_cast<int64_t>(in[1][e]); i < static_cast<int64_t>(in[1][e + 1]); ++i) {
        DVec row = ref::expert_ffn(d, w, e, &in[0][i * l]);
        std::copy(row.begin(), row.end(), y.begin() + i * l);
      }
    return {y};
  }

 private:
  FfnSetup s_;
  ops::GroupedFfnSaved saved_;
};

TEST(GroupedFfn, ZeroTokenExperts) {
  GroupedFfnCase c({.rows = 10, .experts = 8, .in = 19, .ffn = 23});
  check_op(c);
}

TEST(GroupedFfn, OddSizes) {
  GroupedFfnCase c({.rows = 53, .experts = 5, .in = 19, .ffn = 23});
  check_op(c);
}

TEST(GroupedFfn, PerExpertLora) {
  GroupedFfnCase c({.rows = 41, .experts = 7, .in = 19, .ffn = 23, .rank = 3, .alpha = 8.f});
  check_op(c);
}

TEST(GroupedFfn, PerExpertLoraFrozenBase) {
  GroupedFfnCase c({.rows = 29,
                    .experts = 8,
                    .in = 17,
                    .ffn = 11,
                    .rank = 4,
                    .alpha = 6.f,
                    .frozen_base = true});
  check_op(c);
}

// Empty experts (every third) get their dW blocks written as zeros, not left as they were.
TEST(GroupedFfn, WeightGradsWrittenWhenTheCallerSaysTheyAreZero) {
  GroupedFfnCase plain({.rows = 37, .experts = 7, .in = 19, .ffn = 23, .weight_grads_zero = true});
  check_op(plain);
  GroupedFfnCase lora({.rows = 41,
                       .experts = 7,
                       .in = 19,
                       .ffn = 23,
                       .rank = 3,
                       .alpha = 8.f,
                       .weight_grads_zero = true});
  check_op(lora);
}

// h kept from forward (GroupedFfnParams::keep_h): the down projection's dW reads it instead of an h
// formed by SwiGLU's backward; a frozen base reads none.
TEST(GroupedFfn, HKeptFromForward) {
  GroupedFfnCase full({.rows = 43, .experts = 7, .in = 19, .ffn = 23, .keep_h = true});
  check_op(full);
  GroupedFfnCase written(
      {.rows = 37, .experts = 6, .in = 17, .ffn = 13, .weight_grads_zero = true, .keep_h = true});
  check_op(written);
  GroupedFfnCase frozen(
      {.rows = 31, .experts = 5, .in = 11, .ffn = 9, .frozen_base = true, .keep_h = true});
  check_op(frozen);
}

// The interleaved gate/up layout (GroupedFfnParams::interleaved_gate_up) against the reference
// reading the weight (and the adapter's B_gu) as [g | u]: the base training (h formed in SwiGLU's
// backward), dW written, h kept, a frozen base, an adapter with the base trained and frozen; F of
// one, two and three block pairs.
TEST(GroupedFfn, InterleavedGateUp) {
  GroupedFfnCase full({.rows = 43, .experts = 7, .in = 19, .ffn = 32, .interleaved = true});
  check_op(full);
  GroupedFfnCase written({.rows = 37,
                          .experts = 6,
                          .in = 17,
                          .ffn = 48,
                          .weight_grads_zero = true,
                          .interleaved = true});
  check_op(written);
  GroupedFfnCase kept(
      {.rows = 31, .experts = 5, .in = 11, .ffn = 16, .keep_h = true, .interleaved = true});
  check_op(kept);
  GroupedFfnCase frozen(
      {.rows = 29, .experts = 4, .in = 13, .ffn = 32, .frozen_base = true, .interleaved = true});
  check_op(frozen);
  GroupedFfnCase lora({.rows = 41,
                       .experts = 7,
                       .in = 19,
                       .ffn = 32,
                       .rank = 3,
                       .alpha = 8.f,
                       .interleaved = true});
  check_op(lora);
  GroupedFfnCase lora_frozen({.rows = 29,
                              .experts = 5,
                              .in = 17,
                              .ffn = 16,
                              .rank = 4,
                              .alpha = 6.f,
                              .frozen_base = true,
                              .interleaved = true});
  check_op(lora_frozen);
}

// grouped_ffn_interleave_gate_up moves each row where interleaved_source says, and back.
TEST(GroupedFfn, InterleaveGateUpRows) {
  Context ctx;
  const uint64_t seed = test_seed();
  Rng rng(seed);
  const int64_t E = 3, F = 48, l = 5;
  Tensor w = Tensor::empty({E, 2 * F, l}), il = Tensor::empty({E, 2 * F, l}),
         back = Tensor::empty({E, 2 * F, l});
  for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = static_cast<float>(rng.normal());
  ops::grouped_ffn_interleave_gate_up(ctx, w, il);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t p = 0; p < 2 * F; ++p)
      for (int64_t c = 0; c < l; ++c)
        ASSERT_EQ(il.f32()[(e * 2 * F + p) * l + c],
                  w.f32()[(e * 2 * F + interleaved_source(p, F)) * l + c])
            << "expert " << e << " row " << p << ", " << seed_note();
  ops::grouped_ffn_interleave_gate_up(ctx, il, back, true);
  for (int64_t i = 0; i < w.numel(); ++i)
    ASSERT_EQ(back.f32()[i], w.f32()[i]) << "element " << i << ", " << seed_note();
  // F not a multiple of the block, and an output aliasing the input: errors.
  Tensor odd = Tensor::empty({E, 46, l});
  EXPECT_THROW(ops::grouped_ffn_interleave_gate_up(ctx, odd, odd), ShapeError);
  EXPECT_THROW(ops::grouped_ffn_interleave_gate_up(ctx, w, w), ValueError);
}

// The interleaved layout wants F in whole blocks, with an adapter or without: clear errors.
TEST(GroupedFfn, InterleavedGateUpRefusesWhatItCannotServe) {
  Context ctx;
  for (const auto& [F, r] : {std::pair<int64_t, int64_t>{24, 0}, {40, 2}}) {
    ops::GroupedFfnParams p{.rows = 4,
                            .experts = 2,
                            .in = 3,
                            .ffn = F,
                            .lora_rank = r,
                            .lora_alpha = 4.f,
                            .interleaved_gate_up = true};
    Tensor x = Tensor::zeros({4, 3}), off = Tensor::zeros({3}, DType::I32);
    off.i32()[1] = 2;
    off.i32()[2] = 4;
    ops::GroupedFfnWeights w{.gate_up = Tensor::zeros({2, 2 * F, 3}),
                             .down = Tensor::zeros({2, 3, F})};
    if (r > 0) {
      w.gate_up_a = Tensor::zeros({2, r, 3});
      w.gate_up_b = Tensor::zeros({2, 2 * F, r});
      w.down_a = Tensor::zeros({2, r, F});
      w.down_b = Tensor::zeros({2, 3, r});
    }
    ArenaPlan plan;
    ops::grouped_ffn_plan(p, plan);
    Arena acts(plan.bytes(), Device::CPU, "acts");
    ops::GroupedFfnSaved saved = ops::grouped_ffn_alloc_saved(p, acts);
    Tensor y = Tensor::empty({4, 3});
    EXPECT_THROW(ops::grouped_ffn_forward(ctx, p, x, off, w, y, saved), ValueError)
        << "F " << F << " rank " << r;
  }
}

TEST(GroupedFfn, NoRows) {
  GroupedFfnCase c({.rows = 0, .experts = 4, .in = 5, .ffn = 3, .rank = 2});
  check_op(c);
}

TEST(GroupedFfn, BadOffsetsAreAnError) {
  Context ctx;
  ops::GroupedFfnParams p{.rows = 4, .experts = 2, .in = 3, .ffn = 2};
  Tensor x = Tensor::zeros({4, 3}), off = Tensor::zeros({3}, DType::I32);
  off.i32()[1] = 2;
  off.i32()[2] = 3;  // does not reach rows
  ops::GroupedFfnWeights w{.gate_up = Tensor::zeros({2, 4, 3}), .down = Tensor::zeros({2, 3, 2})};
  ArenaPlan plan;
  ops::grouped_ffn_plan(p, plan);
  Arena acts(plan.bytes(), Device::CPU, "acts");
  ops::GroupedFfnSaved saved = ops::grouped_ffn_alloc_saved(p, acts);
  Tensor y = Tensor::empty({4, 3});
  EXPECT_THROW(ops::grouped_ffn_forward(ctx, p, x, off, w, y, saved), ValueError);
}

}  // namespace
}  // namespace mt::test
