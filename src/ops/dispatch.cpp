#include "ops/dispatch.h"

#include "core/error.h"

namespace mt::ops {

namespace {

template <typename It, typename Get>
Device common_device(const char* op, It begin, It end, Get get) {
  const Tensor* first = nullptr;
  for (It it = begin; it != end; ++it) {
    const Tensor* t = get(*it);
    // An undefined tensor is an absent optional (no LoRA, no dw); an empty one has no memory to
    // place, so neither takes part in the rule.
    if (!t->defined() || t->raw() == nullptr) continue;
    if (!first) {
      first = t;
      continue;
    }
    MT_CHECK(t->device() == first->device(), ValueError, op, ": tensors on ",
             device_name(first->device()), " and ", device_name(t->device()),
             "; every tensor of one call must be on the same device");
  }
  return first ? first->device() : Device::CPU;
}

}  // namespace

Device op_device(const char* op, std::initializer_list<const Tensor*> ts) {
  return common_device(op, ts.begin(), ts.end(), [](const Tensor* t) { return t; });
}

Device op_device(const char* op, const std::vector<Tensor>& ts) {
  return common_device(op, ts.begin(), ts.end(), [](const Tensor& t) { return &t; });
}

void no_cuda_backend(const char* op) {
  MT_THROW(ValueError, op,
           ": got CUDA tensors, but this binary was built without CUDA (configure with "
           "-DMOETRAIN_CUDA=ON)");
}

void no_cuda_kernel(const char* op) {
  MT_THROW(ValueError, op, ": got CUDA tensors, but this op has no CUDA kernel yet");
}

void expect_f64_scalar(const Tensor& t, const char* what) {
  MT_CHECK(t.dtype() == DType::F64, ShapeError, what, " is ", dtype_name(t.dtype()),
           ", expected f64");
  expect_shape(t, {1}, what);
}

}  // namespace mt::ops
