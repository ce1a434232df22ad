// Tensor: a typed, shaped, strided view of memory on one device. A tensor either owns its storage
// (Tensor::empty/zeros) or views someone else's (an arena, a slice of another tensor). Ops take
// tensors, never raw host pointers, so the same signature serves CPU and CUDA storage.
//
// Strides are in elements and row-major unless a view says otherwise: cols() keeps the parent's
// strides, so a column slice of a fused projection output is a view, not a copy. Ops that read
// raw memory need contiguous tensors; f32()/i32()/... and expect_shape() refuse strided views, so
// a view reaching such an op is a ShapeError, never a silent misread. Ops that take strided
// operands (matmul, grouped_matmul, copy_from, the element ops) say so and read strides.
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
  // Non-owning, contiguous view of memory that outlives the tensor (an arena block, a mapped file).
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
  // Address of the first element; with strides, not of a dense block.
  void* raw() const { return data_; }

  // Element strides, one per dimension (row-major for anything but a column view).
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t stride(int i) const { return strides_.at(i < 0 ? i + ndim() : i); }
  bool is_contiguous() const { return contiguous_; }

  // Typed host access to contiguous memory; throws ShapeError on a dtype mismatch or a strided
  // view and ValueError on device memory.
  float* f32() const { return typed<float>(DType::F32); }
  int32_t* i32() const { return typed<int32_t>(DType::I32); }
  int64_t* i64() const { return typed<int64_t>(DType::I64); }
  uint16_t* bf16() const { return typed<uint16_t>(DType::BF16); }
  // The same for code that walks strides() itself (CPU kernels taking strided views).
  float* f32_strided() const { return typed<float>(DType::F32, true); }

  // Same memory, another shape with the same element count (contiguous tensors only).
  Tensor view(Shape shape) const;
  // Rows [begin, end) along the first dimension, sharing memory (strides kept).
  Tensor rows(int64_t begin, int64_t end) const;
  // Columns [begin, end) along the last dimension (at least 2-D), sharing memory: the result
  // keeps the parent's strides, so it is strided unless it spans every column.
  Tensor cols(int64_t begin, int64_t end) const;

  void zero_();
  // Same element count (same shape when either side is strided); converts between f32 and bf16;
  // copies across devices (contiguous tensors only).
  void copy_from(const Tensor& src);
  Tensor clone() const;  // contiguous
  // A copy on `device` (same dtype and shape).
  Tensor to(Device device) const;

 private:
  template <typename T>
  T* typed(DType want, bool strided_ok = false) const {
    MT_CHECK(dtype_ == want, ShapeError, "tensor ", shape_, " is ", dtype_name(dtype_),
             ", accessed as ", dtype_name(want));
    MT_CHECK(strided_ok || contiguous_, ShapeError, "tensor ", shape_, " is a strided view",
             " (strides ", Shape(strides_), "); this access needs contiguous memory");
    MT_CHECK(device_ == Device::CPU || data_ == nullptr, ValueError, "host access to a tensor on ",
             device_name(device_));
    return static_cast<T*>(data_);
  }
  void set_shape(Shape shape, std::vector<int64_t> strides);

  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  std::vector<int64_t> strides_;
  bool contiguous_ = true;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// Throws ShapeError naming `what` unless t has exactly this shape and is contiguous (ops that
// accept strided views check their shapes with expect_dims).
void expect_shape(const Tensor& t, const Shape& want, const char* what);
// Shape only; strides may be anything.
void expect_dims(const Tensor& t, const Shape& want, const char* what);
// Row-major strides of a shape.
std::vector<int64_t> contiguous_strides(const Shape& shape);

}  // namespace mt
