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

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace mt {

// Dimensions (or element strides) held inline, so that making a tensor or a view never touches
// the heap: a training step builds thousands of views and must not allocate (docs/gpu.md).
constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> d) { assign(d.begin(), d.size()); }
  explicit Shape(const std::vector<int64_t>& d) { assign(d.data(), d.size()); }

  int ndim() const { return n_; }
  int64_t operator[](int i) const {
    const int j = i < 0 ? i + n_ : i;
    MT_CHECK(j >= 0 && j < n_, ShapeError, "dimension ", i, " of a ", n_, "-d shape");
    return d_[static_cast<size_t>(j)];
  }
  int64_t& at(int i) { return d_[static_cast<size_t>(i < 0 ? i + n_ : i)]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < n_; ++i) n *= d_[static_cast<size_t>(i)];
    return n;
  }
  // A copy (for serialisation and error messages, outside the step).
  std::vector<int64_t> dims() const { return {d_.begin(), d_.begin() + n_}; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  bool operator==(const Shape& o) const {
    if (n_ != o.n_) return false;
    for (int i = 0; i < n_; ++i)
      if (d_[static_cast<size_t>(i)] != o.d_[static_cast<size_t>(i)]) return false;
    return true;
  }
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;

 private:
  void assign(const int64_t* d, size_t n) {
    MT_CHECK(n <= static_cast<size_t>(kMaxDims), ShapeError, "a shape of ", n,
             " dimensions (at most ", kMaxDims, ")");
    n_ = static_cast<int>(n);
    for (size_t i = 0; i < n; ++i) d_[i] = d[i];
  }
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
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
  const Shape& strides() const { return strides_; }
  int64_t stride(int i) const { return strides_[i]; }
  bool is_contiguous() const { return contiguous_; }

  // Typed host access to contiguous memory; throws ShapeError on a dtype mismatch or a strided
  // view and ValueError on device memory.
  float* f32() const { return typed<float>(DType::F32); }
  int32_t* i32() const { return typed<int32_t>(DType::I32); }
  int64_t* i64() const { return typed<int64_t>(DType::I64); }
  uint16_t* bf16() const { return typed<uint16_t>(DType::BF16); }
  double* f64() const { return typed<double>(DType::F64); }
  // The same for code that walks strides() itself (CPU kernels taking strided views).
  float* f32_strided() const { return typed<float>(DType::F32, true); }

  // Same memory, another shape with the same element count (contiguous tensors only).
  Tensor view(Shape shape) const;
  // Rows [begin, end) along the first dimension, sharing memory (strides kept).
  Tensor rows(int64_t begin, int64_t end) const;
  // Columns [begin, end) along the last dimension (at least 2-D), sharing memory: the result
  // keeps the parent's strides, so it is strided unless it spans every column.
  Tensor cols(int64_t begin, int64_t end) const;
  // [begin, end) along dimension `dim`, sharing memory (strides kept): a block of a padded buffer,
  // e.g. an expert weight inside its LoRA-padded storage (ops/grouped_ffn.h).
  Tensor narrow(int dim, int64_t begin, int64_t end) const;

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
             " (strides ", strides_, "); this access needs contiguous memory");
    MT_CHECK(device_ == Device::CPU || data_ == nullptr, ValueError, "host access to a tensor on ",
             device_name(device_));
    return static_cast<T*>(data_);
  }
  void set_shape(const Shape& shape, const Shape& strides);

  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  Shape strides_;  // in elements, one per dimension
  bool contiguous_ = true;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

// The value of a one-element f64 or f32 tensor, copied to the host when it lives on a device: a
// synchronisation point, so callers read a step's scalars once, after the step (docs/gpu.md).
double read_scalar(const Tensor& t);
// Makes t a one-element f64 tensor on `device` (zero); keeps it when it already is one, so that
// the steps after the first allocate nothing.
void ensure_scalar(Tensor& t, Device device);

// Throws ShapeError naming `what` unless t has exactly this shape and is contiguous (ops that
// accept strided views check their shapes with expect_dims).
void expect_shape(const Tensor& t, const Shape& want, const char* what);
// Shape only; strides may be anything.
void expect_dims(const Tensor& t, const Shape& want, const char* what);
// Row-major strides of a shape.
Shape contiguous_strides(const Shape& shape);

}  // namespace mt
