// The backend-compare / gradient harness every op and layer test goes through.
//
// A test describes its op as an OpCase: the inputs (shapes, how to draw them, which are
// differentiable and whether their gradient accumulates), the fast path (forward + backward on
// Tensors) and an independent double-precision reference of the forward. check_op() then
//  1. draws fresh random inputs,
//  2. runs the fast forward into guarded buffers (canaries before/after, bodies pre-filled with
//     NaN so unwritten outputs show) and compares every output with the reference (norm-wise
//     relative error),
//  3. runs the fast backward with a random upstream gradient and checks each input gradient
//     against central finite differences of the double reference (random directions and single
//     elements), honouring the contract: parameter grads accumulate (+=), activation grads are
//     written (=),
//  4. checks that no input was modified and no guard was overwritten,
//  5. when a GPU is visible (and the binary has the CUDA backend), repeats 2-4 on the GPU with the
//     same inputs, upstream gradients and pre-fills, and compares every output and gradient with
//     the CPU's (harness/tolerance.h). MOETRAIN_TEST_DEVICE=cpu turns this pass off.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace mt::test {

using DVec = std::vector<double>;

struct InputSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  bool differentiable = true;
  // true for parameters (gradient is added to what the buffer holds), false for activations
  // (gradient overwrites the buffer).
  bool accumulate = false;
  double scale = 1.0;  // default draw: normal(0, scale)
  // Custom draw (token ids, indices, positive values...). Receives the allocated tensor.
  std::function<void(Rng&, Tensor&)> init;
  // Stays in host memory in the device pass: a plan the op reads on the host (group offsets
  // from the routing plan), never a tensor the kernels read.
  bool host = false;
};

struct OutputSpec {
  std::string name;
  bool differentiable = true;  // false: integer outputs or values the loss does not depend on
};

class GuardedAlloc;

class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual std::string name() const = 0;
  virtual std::vector<InputSpec> inputs() const = 0;
  virtual std::vector<OutputSpec> outputs() const = 0;
  // Fast path forward. Allocate outputs with `alloc`; keep whatever backward needs in members.
  virtual std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                                      const std::vector<Tensor>& in) = 0;
  // Fast path backward. grads[i] is defined for each differentiable input (pre-filled by the
  // harness: random for accumulate inputs, NaN otherwise); dout[j] is undefined for outputs that
  // are not differentiable.
  virtual void backward(Context& ctx, GuardedAlloc& alloc, const std::vector<Tensor>& in,
                        const std::vector<Tensor>& dout, std::vector<Tensor>& grads) = 0;
  // Double-precision reference forward, one DVec per output, flattened row-major.
  virtual std::vector<DVec> reference(const std::vector<DVec>& in) const = 0;
  // Rejects a draw of inputs on which the op is not smooth enough to compare (e.g. a near-tie
  // in a top-k selection that fp32 and double could break differently); check_op redraws.
  virtual bool accept(const std::vector<DVec>& /*in*/) const { return true; }
  // What made the last draw acceptable (its margins), printed with any failure: a failure on a
  // draw that only just passed accept() points at the margin before the code.
  virtual std::string accept_note() const { return ""; }
};

struct CheckOptions {
  double fwd_rtol = 1e-5;   // norm-wise relative error of each output vs the reference
  double grad_rtol = 1e-4;  // relative error of gradients vs finite differences
  double fd_step = 1e-6;    // relative step of central differences (on the double reference)
  int directions = 2;       // random-direction checks per differentiable input
  int elements = 6;         // single-element checks per differentiable input
  uint64_t seed = 0;        // 0: a fresh seed per run (printed on failure)
  // > 0: the backward is rerun three times on the f32 inputs perturbed by about one ulp
  // (relative 2^-23 N(0,1)), and rounding_floor times the largest change of each gradient is
  // added to its tolerances. For ops that are ill-conditioned on some draws (a cancellation ahead
  // of a norm near its eps), where f32 rounding alone moves a gradient by more than grad_rtol;
  // a formula error does not move under an ulp, so the floor cannot hide one.
  double rounding_floor = 0;
};

// Allocates tensors with guard bands and NaN-filled bodies; check() verifies the guards. On the
// GPU the blocks are device memory, filled and checked through host copies.
class GuardedAlloc {
 public:
  explicit GuardedAlloc(Device device = Device::CPU) : device_(device) {}
  ~GuardedAlloc();
  GuardedAlloc(const GuardedAlloc&) = delete;
  GuardedAlloc& operator=(const GuardedAlloc&) = delete;
  Tensor operator()(const Shape& shape, DType dtype = DType::F32);
  // Returns a description of the first corrupted guard, or "" when all are intact.
  std::string check() const;

 private:
  struct Block {
    std::vector<uint8_t> mem;  // the block (CPU), or its initial image (GPU)
    void* device_mem = nullptr;
    size_t body_bytes;
    size_t guard_bytes;
    Shape shape;
  };
  Device device_;
  std::vector<std::unique_ptr<Block>> blocks_;
};

// Runs all checks with gtest assertions; messages name the case, the tensor and the seed.
void check_op(OpCase& op, const CheckOptions& opt = {});
// True when check_op also runs each case on the GPU (a GPU is visible, the binary has the CUDA
// backend, and MOETRAIN_TEST_DEVICE is not "cpu").
bool device_pass_enabled();

// `t` on the context's device (a copy when it is elsewhere): for tensors a case builds itself,
// such as cu_seqlens from a SeqInfo, so that the device pass hands the op one device.
Tensor on_device(Context& ctx, const Tensor& t);

// Conversions used by references.
DVec to_dvec(const Tensor& t);
void fill_normal(Rng& rng, Tensor& t, double scale = 1.0);
double rel_err(const DVec& a, const DVec& b);  // ||a-b|| / max(||b||, 1e-30)

}  // namespace mt::test
