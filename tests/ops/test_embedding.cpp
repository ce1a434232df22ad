#include <gtest/gtest.h>

#include "harness/op_check.h"
#include "ops/embedding.h"
#include "ref/embedding_ref.h"

namespace mt::test {
namespace {

class EmbeddingCase : public OpCase {
 public:
  explicit EmbeddingCase(ops::EmbeddingParams p) : p_(p) {}
  std::string name() const override {
    return cat("embedding tokens=", p_.tokens, " vocab=", p_.vocab, " dim=", p_.dim);
  }
  std::vector<InputSpec> inputs() const override {
    const int64_t vocab = p_.vocab;
    return {{.name = "ids",
             .shape = {p_.tokens},
             .dtype = DType::I32,
             .differentiable = false,
             .init =
                 [vocab](Rng& rng, Tensor& t) {
                   for (int64_t i = 0; i < t.numel(); ++i)
                     t.i32()[i] = static_cast<int32_t>(rng.below(vocab));
                 }},
            {.name = "table", .shape = {p_.vocab, p_.dim}, .accumulate = true}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({p_.tokens, p_.dim});
    ops::embedding_forward(ctx, p_, in[0], in[1], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::embedding_backward(ctx, p_, in[0], dout[0], grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::embedding(in[0], in[1], p_.dim)};
  }

 private:
  ops::EmbeddingParams p_;
};

// Fewer rows than tokens, so ids repeat and the backward must add up duplicates.
TEST(Embedding, RepeatedIds) {
  EmbeddingCase c({.tokens = 53, .vocab = 11, .dim = 37});
  check_op(c);
}

TEST(Embedding, WideRows) {
  EmbeddingCase c({.tokens = 7, .vocab = 29, .dim = 131});
  check_op(c);
}

TEST(Embedding, OutOfRangeIdIsAValueError) {
  Context ctx;
  ops::EmbeddingParams p{.tokens = 5, .vocab = 10, .dim = 3};
  Tensor ids = Tensor::zeros({5}, DType::I32), table = Tensor::zeros({10, 3});
  Tensor y = Tensor::zeros({5, 3});
  for (int32_t bad : {10, -1}) {
    ids.i32()[3] = bad;
    try {
      ops::embedding_forward(ctx, p, ids, table, y);
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const ValueError& e) {
      EXPECT_NE(e.message().find(cat("id ", bad)), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("position 3"), std::string::npos) << e.message();
    }
    EXPECT_THROW(ops::embedding_backward(ctx, p, ids, y, table), ValueError);
  }
}

}  // namespace
}  // namespace mt::test
