#include <gtest/gtest.h>

#include "harness/op_check.h"
#include "ops/activation.h"
#include "ref/activation_ref.h"

namespace mt::test {
namespace {

class SiluCase : public OpCase {
 public:
  explicit SiluCase(Shape s) : shape_(std::move(s)) {}
  std::string name() const override { return "silu" + shape_.str(); }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "x", .shape = shape_, .scale = 3.0}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc(shape_);
    ops::silu_forward(ctx, in[0], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::silu_backward(ctx, in[0], dout[0], grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::silu(in[0])};
  }

 private:
  Shape shape_;
};

class SwigluCase : public OpCase {
 public:
  explicit SwigluCase(Shape s) : shape_(std::move(s)) {}
  std::string name() const override { return "swiglu" + shape_.str(); }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "gate", .shape = shape_, .scale = 2.0}, {.name = "up", .shape = shape_}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc(shape_);
    ops::swiglu_forward(ctx, in[0], in[1], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::swiglu_backward(ctx, in[0], in[1], dout[0], grads[0], grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::swiglu(in[0], in[1])};
  }

 private:
  Shape shape_;
};

class SigmoidGateCase : public OpCase {
 public:
  explicit SigmoidGateCase(Shape s) : shape_(std::move(s)) {}
  std::string name() const override { return "sigmoid_gate" + shape_.str(); }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "x", .shape = shape_}, {.name = "g", .shape = shape_, .scale = 2.0}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc(shape_);
    ops::sigmoid_gate_forward(ctx, in[0], in[1], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::sigmoid_gate_backward(ctx, in[0], in[1], dout[0], grads[0], grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::sigmoid_gate(in[0], in[1])};
  }

 private:
  Shape shape_;
};

TEST(Activation, Silu) {
  SiluCase c({67, 13});
  check_op(c);
}

TEST(Activation, SwiGLU) {
  SwigluCase c({31, 37});
  check_op(c);
}

TEST(Activation, SigmoidGate) {
  SigmoidGateCase c({5, 3, 29});
  check_op(c);
}

TEST(Activation, ShapeMismatchIsAnError) {
  Context ctx;
  Tensor x = Tensor::zeros({4, 3}), y = Tensor::zeros({3, 4});
  EXPECT_THROW(ops::silu_forward(ctx, x, y), ShapeError);
}

}  // namespace
}  // namespace mt::test
