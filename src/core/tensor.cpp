#include "core/tensor.h"

#include "core/device.h"

#include <cstdlib>
#include <cstring>

namespace mt {

std::string Shape::str() const {
  std::string s = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(dims_[i]);
  }
  s += ']';
  return s;
}

Storage::Storage(size_t n, Device dev) : bytes(n), device(dev) {
  data = device_alloc(n, dev);
}

Storage::~Storage() {
  device_free(data, device);
}

Tensor::Tensor(void* data, Shape shape, DType dtype, Device device)
    : data_(data), shape_(std::move(shape)), dtype_(dtype), device_(device) {}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape.dims()) MT_CHECK(d >= 0, ShapeError, "negative dimension in ", shape);
  auto st =
      std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  Tensor t(st->data, std::move(shape), dtype, device);
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::view(Shape shape) const {
  MT_CHECK(shape.numel() == numel(), ShapeError, "cannot view ", shape_, " as ", shape);
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  MT_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0), ShapeError, "rows [", begin,
           ",", end, ") out of ", shape_);
  std::vector<int64_t> d = shape_.dims();
  int64_t row_elems = d[0] ? numel() / d[0] : 0;
  d[0] = end - begin;
  Tensor t = *this;
  t.shape_ = Shape(std::move(d));
  t.data_ =
      static_cast<char*>(data_) + begin * row_elems * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

void Tensor::zero_() {
  zero_bytes(data_, device_, bytes());
}

void Tensor::copy_from(const Tensor& src) {
  MT_CHECK(src.numel() == numel(), ShapeError, "copy ", src.shape(), " into ", shape_);
  if (src.dtype() == dtype_) {
    copy_bytes(data_, device_, src.raw(), src.device(), bytes());
  } else if (src.device() != Device::CPU || device_ != Device::CPU) {
    // Conversions run on the host; a GPU tensor converts through a host copy first.
    Tensor host_src = src.device() == Device::CPU ? src : src.to(Device::CPU);
    Tensor host_dst = device_ == Device::CPU ? *this : Tensor::empty(shape_, dtype_);
    host_dst.copy_from(host_src);
    if (device_ != Device::CPU) copy_bytes(data_, device_, host_dst.raw(), Device::CPU, bytes());
  } else if (src.dtype() == DType::BF16 && dtype_ == DType::F32) {
    const uint16_t* s = src.bf16();
    float* d = f32();
    for (int64_t i = 0; i < numel(); ++i) d[i] = bf16_to_f32(s[i]);
  } else if (src.dtype() == DType::F32 && dtype_ == DType::BF16) {
    const float* s = src.f32();
    uint16_t* d = bf16();
    for (int64_t i = 0; i < numel(); ++i) d[i] = f32_to_bf16(s[i]);
  } else {
    MT_THROW(ShapeError, "no conversion from ", dtype_name(src.dtype()), " to ",
             dtype_name(dtype_));
  }
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

void expect_shape(const Tensor& t, const Shape& want, const char* what) {
  MT_CHECK(t.shape() == want, ShapeError, what, " has shape ", t.shape(), ", expected ", want);
}

}  // namespace mt
