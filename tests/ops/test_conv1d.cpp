#include <gtest/gtest.h>

#include <cmath>

#include "core/seq_info.h"
#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/conv1d.h"
#include "ref/conv1d_ref.h"

namespace mt::test {
namespace {

class CausalConvCase : public OpCase {
 public:
  // silu: CausalConvParams::silu, against the reference's conv followed by SiLU in double.
  CausalConvCase(std::vector<int64_t> lengths, int64_t channels, int64_t kernel, bool silu = false)
      : seq_(SeqInfo::from_lengths(lengths)),
        p_{.tokens = seq_.tokens, .channels = channels, .kernel = kernel, .silu = silu} {}
  std::string name() const override {
    return cat("causal_conv1d docs=", seq_.num_seqs, " tokens=", p_.tokens, " C=", p_.channels,
               " K=", p_.kernel, p_.silu ? " silu" : "");
  }
  std::vector<InputSpec> inputs() const override {
    Tensor cu = seq_.cu_seqlens;
    return {{.name = "cu_seqlens",
             .shape = cu.shape(),
             .dtype = DType::I32,
             .differentiable = false,
             .init = [cu](Rng&, Tensor& t) { t.copy_from(cu); }},
            {.name = "x", .shape = {p_.tokens, p_.channels}},
            {.name = "w", .shape = {p_.channels, p_.kernel}, .accumulate = true, .scale = 0.5}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({p_.tokens, p_.channels});
    ops::causal_conv1d_forward(ctx, p_, in[0], in[1], in[2], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::causal_conv1d_backward(ctx, p_, in[0], in[1], in[2], dout[0], grads[1], grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    DVec y = ref::causal_conv1d(in[1], in[2], seq_.offsets, p_.channels, p_.kernel);
    if (p_.silu)
      for (double& v : y) v = v / (1.0 + std::exp(-v));
    return {y};
  }

 private:
  SeqInfo seq_;
  ops::CausalConvParams p_;
};

// Documents shorter than the kernel (1 and 2 tokens) sit between longer ones.
TEST(CausalConv1d, ShortDocuments) {
  CausalConvCase c({13, 1, 2, 9}, 19, 4);
  check_op(c);
}

TEST(CausalConv1d, ThreeDocuments) {
  CausalConvCase c({1, 2, 17}, 37, 4);
  check_op(c);
}

TEST(CausalConv1d, OneDocument) {
  CausalConvCase c({67}, 5, 4);
  check_op(c);
}

TEST(CausalConv1d, OtherKernel) {
  CausalConvCase c({3, 11}, 7, 3);
  check_op(c);
}

// The short conv with its SiLU in one op (KDA's): forward and the gradients through both, with
// documents shorter than the kernel and a kernel of 3.
TEST(CausalConv1d, WithSilu) {
  CausalConvCase shorts({13, 1, 2, 9}, 19, 4, true);
  check_op(shorts);
  CausalConvCase other({3, 11}, 7, 3, true);
  check_op(other);
}

// Changing one document's input leaves every other document's output untouched.
TEST(CausalConv1d, NoLeakageAcrossDocuments) {
  Context ctx;
  Rng rng(test_seed());
  SeqInfo seq = SeqInfo::from_lengths({5, 1, 2, 6});
  ops::CausalConvParams p{.tokens = seq.tokens, .channels = 3, .kernel = 4};
  Tensor x = Tensor::empty({p.tokens, 3}), w = Tensor::empty({3, 4});
  fill_normal(rng, x);
  fill_normal(rng, w);
  Tensor y0 = Tensor::empty(x.shape()), y1 = Tensor::empty(x.shape());
  ops::causal_conv1d_forward(ctx, p, seq.cu_seqlens, x, w, y0);
  for (int64_t t = 0; t < seq.offsets[3]; ++t)  // documents 0..2
    for (int64_t c = 0; c < 3; ++c) x.f32()[t * 3 + c] += 100.f;
  ops::causal_conv1d_forward(ctx, p, seq.cu_seqlens, x, w, y1);
  for (int64_t t = seq.offsets[3]; t < p.tokens; ++t)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(y0.f32()[t * 3 + c], y1.f32()[t * 3 + c]) << t;
}

}  // namespace
}  // namespace mt::test
