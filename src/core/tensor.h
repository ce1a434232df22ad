// Tensor: a typed, shaped view of memory on one device. A tensor either owns its storage
// (Tensor::empty/zeros) or views someone else's (an arena, a slice of another tensor). Ops take
// tensors, never raw host pointers, so the same signature serves CPU and CUDA storage.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace mt {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> d) : dims_(d) {}
  explicit Shape(std::vector<int64_t> d) : dims_(std::move(d)) {}

  int ndim() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_.at(i < 0 ? i + ndim() : i); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return n;
  }
  const std::vector<int64_t>& dims() const { return dims_; }
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  std::string str() const;

 private:
  std::vector<int64_t> dims_;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << s.str();
}

// Owned device memory. Freed when the last tensor viewing it goes away.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

class Tensor {
 public:
  Tensor() = default;
  // Non-owning view of memory that outlives the tensor (an arena block, a mapped file).
  Tensor(void* data, Shape shape, DType dtype, Device device = Device::CPU);

  static Tensor empty(Shape shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(Shape shape, DType dtype = DType::F32, Device device = Device::CPU);

  bool defined() const { return data_ != nullptr || shape_.numel() == 0; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  void* raw() const { return data_; }

  // Typed host access; throws ShapeError on a dtype mismatch and ValueError on device memory.
  float* f32() const { return typed<float>(DType::F32); }
  int32_t* i32() const { return typed<int32_t>(DType::I32); }
  int64_t* i64() const { return typed<int64_t>(DType::I64); }
  uint16_t* bf16() const { return typed<uint16_t>(DType::BF16); }

  // Same memory, another shape with the same element count.
  Tensor view(Shape shape) const;
  // Rows [begin, end) along the first dimension, sharing memory.
  Tensor rows(int64_t begin, int64_t end) const;

  void zero_();
  // Same element count; converts between f32 and bf16; copies across devices.
  void copy_from(const Tensor& src);
  Tensor clone() const;
  // A copy on `device` (same dtype and shape).
  Tensor to(Device device) const;

 private:
  template <typename T>
  T* typed(DType want) const {
    MT_CHECK(dtype_ == want, ShapeError, "tensor ", shape_, " is ", dtype_name(dtype_),
             ", accessed as ", dtype_name(want));
    MT_CHECK(device_ == Device::CPU || data_ == nullptr, ValueError, "host access to a tensor on ",
             device_name(device_));
    return static_cast<T*>(data_);
  }

  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Throws ShapeError naming `what` unless t has exactly this shape.
void expect_shape(const Tensor& t, const Shape& want, const char* what);

}  // namespace mt
