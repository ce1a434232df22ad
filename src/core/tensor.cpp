#include "core/tensor.h"

#include "core/device.h"

#include <array>
#include <cstdlib>
#include <cstring>

namespace mt {

namespace {

bool strides_are_contiguous(const Shape& shape, const Shape& strides) {
  int64_t want = 1;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != want) return false;
    want *= shape[i];
  }
  return true;
}

// Calls fn(offset_a, offset_b) (elements) for the start of every innermost row of `shape`, walked
// with two stride sets; rows have shape[-1] elements (1 for a 0-D tensor).
template <typename Fn>
void for_each_row(const Shape& shape, const Shape& sa, const Shape& sb, Fn fn) {
  const int outer = shape.ndim() - 1;
  if (shape.numel() == 0) return;
  if (outer <= 0) {
    fn(int64_t{0}, int64_t{0});
    return;
  }
  std::array<int64_t, kMaxDims> idx{};
  int64_t oa = 0, ob = 0;
  while (true) {
    fn(oa, ob);
    int d = outer - 1;
    for (; d >= 0; --d) {
      const auto u = static_cast<size_t>(d);
      if (++idx[u] < shape[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (shape[d] - 1);
      ob -= sb[d] * (shape[d] - 1);
      idx[u] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

Shape contiguous_strides(const Shape& shape) {
  Shape st = shape;
  int64_t s = 1;
  for (int i = shape.ndim() - 1; i >= 0; --i) {
    st.at(i) = s;
    s *= shape[i];
  }
  return st;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < n_; ++i) {
    if (i) s += ',';
    s += std::to_string(d_[static_cast<size_t>(i)]);
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
    : data_(data),
      shape_(std::move(shape)),
      strides_(contiguous_strides(shape_)),
      dtype_(dtype),
      device_(device) {}

void Tensor::set_shape(const Shape& shape, const Shape& strides) {
  shape_ = shape;
  strides_ = strides;
  contiguous_ = strides_are_contiguous(shape_, strides_);
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape) MT_CHECK(d >= 0, ShapeError, "negative dimension in ", shape);
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
  MT_CHECK(contiguous_, ShapeError, "cannot view the strided tensor ", shape_, " (strides ",
           strides_, ") as ", shape);
  Tensor t = *this;
  t.set_shape(shape, contiguous_strides(shape));
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  MT_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0), ShapeError, "rows [", begin,
           ",", end, ") out of ", shape_);
  Shape d = shape_;
  d.at(0) = end - begin;
  Tensor t = *this;
  t.set_shape(d, strides_);
  t.data_ =
      static_cast<char*>(data_) + begin * strides_[0] * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

Tensor Tensor::cols(int64_t begin, int64_t end) const {
  MT_CHECK(ndim() >= 2 && 0 <= begin && begin <= end && end <= dim(-1), ShapeError, "cols [", begin,
           ",", end, ") out of ", shape_);
  Shape d = shape_;
  d.at(-1) = end - begin;
  Tensor t = *this;
  t.set_shape(d, strides_);
  t.data_ =
      static_cast<char*>(data_) + begin * strides_[-1] * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

Tensor Tensor::narrow(int dim, int64_t begin, int64_t end) const {
  MT_CHECK(dim >= 0 && dim < ndim() && 0 <= begin && begin <= end && end <= this->dim(dim),
           ShapeError, "narrow dim ", dim, " [", begin, ",", end, ") out of ", shape_);
  Shape d = shape_;
  d.at(dim) = end - begin;
  Tensor t = *this;
  t.set_shape(d, strides_);
  t.data_ =
      static_cast<char*>(data_) + begin * strides_[dim] * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

void Tensor::zero_() {
  if (contiguous_) {
    zero_bytes(data_, device_, bytes());
    return;
  }
  MT_CHECK(device_ == Device::CPU, ValueError, "zero_ of a strided view on ", device_name(device_));
  const auto es = static_cast<int64_t>(dtype_size(dtype_));
  const int64_t n = ndim() ? dim(-1) : 1, s = ndim() ? stride(-1) : 1;
  char* base = static_cast<char*>(data_);
  for_each_row(shape_, strides_, strides_, [&](int64_t o, int64_t) {
    for (int64_t i = 0; i < n; ++i) std::memset(base + (o + i * s) * es, 0, es);
  });
}

namespace {

bool is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F64;
}

// One element of a float type, widened to double, and back (bf16 rounds to nearest even).
double load_float(const char* p, DType t) {
  if (t == DType::BF16) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return bf16_to_f32(v);
  }
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  }
  double d;
  std::memcpy(&d, p, sizeof d);
  return d;
}

void store_float(char* p, DType t, double x) {
  if (t == DType::BF16) {
    const uint16_t v = f32_to_bf16(static_cast<float>(x));
    std::memcpy(p, &v, sizeof v);
  } else if (t == DType::F32) {
    const float f = static_cast<float>(x);
    std::memcpy(p, &f, sizeof f);
  } else {
    std::memcpy(p, &x, sizeof x);
  }
}

}  // namespace

void Tensor::copy_from(const Tensor& src) {
  MT_CHECK(src.numel() == numel(), ShapeError, "copy ", src.shape(), " into ", shape_);
  const bool same = src.dtype() == dtype_;
  MT_CHECK(same || (is_float(src.dtype()) && is_float(dtype_)), ShapeError, "no conversion from ",
           dtype_name(src.dtype()), " to ", dtype_name(dtype_));
  if (contiguous_ && src.is_contiguous()) {
    // Any shape with the same element count (a flat copy), as before views had strides.
    if (same) {
      copy_bytes(data_, device_, src.raw(), src.device(), bytes());
    } else if (src.device() != Device::CPU || device_ != Device::CPU) {
      // Conversions run on the host; a GPU tensor converts through a host copy first.
      Tensor host_src = src.device() == Device::CPU ? src : src.to(Device::CPU);
      Tensor host_dst = device_ == Device::CPU ? *this : Tensor::empty(shape_, dtype_);
      host_dst.copy_from(host_src);
      if (device_ != Device::CPU) copy_bytes(data_, device_, host_dst.raw(), Device::CPU, bytes());
    } else {
      const char* s = static_cast<const char*>(src.raw());
      char* d = static_cast<char*>(data_);
      const size_t ses = dtype_size(src.dtype()), des = dtype_size(dtype_);
      for (int64_t i = 0; i < numel(); ++i)
        store_float(d + i * des, dtype_, load_float(s + i * ses, src.dtype()));
    }
    return;
  }
  if (same && (device_ != Device::CPU || src.device() != Device::CPU) && ndim() >= 2 &&
      src.shape() == shape_ && stride(-1) == 1 && src.stride(-1) == 1) {
    // Dense rows at some pitch on a device (a weight inside a padded buffer, ops/grouped_ffn.h):
    // one 2-D copy per block of the leading dimensions.
    const int nd = ndim();
    std::vector<int64_t> lead = shape_.dims(), ls = src.strides().dims(), ld = strides_.dims();
    lead.pop_back();
    ls.pop_back();
    ld.pop_back();
    const auto es = static_cast<int64_t>(dtype_size(dtype_));
    for_each_row(Shape(lead), Shape(ls), Shape(ld), [&](int64_t so, int64_t dof) {
      copy_rows(static_cast<char*>(data_) + dof * es, static_cast<size_t>(stride(nd - 2) * es),
                device_, static_cast<const char*>(src.raw()) + so * es,
                static_cast<size_t>(src.stride(nd - 2) * es), src.device(),
                static_cast<size_t>(dim(nd - 1) * es), static_cast<size_t>(dim(nd - 2)));
    });
    return;
  }
  if (src.device() != Device::CPU && !src.is_contiguous()) {  // through a dense copy on its device
    copy_from(src.clone());
    return;
  }
  if (device_ != Device::CPU && !contiguous_) {  // convert into a dense copy, then place it
    Tensor dense = Tensor::empty(shape_, dtype_, device_);
    dense.copy_from(src);
    copy_from(dense);
    return;
  }
  MT_CHECK(device_ == Device::CPU && src.device() == Device::CPU, ValueError, "strided copy from ",
           device_name(src.device()), " to ", device_name(device_),
           ": only host views copy here (ops::copy is the device path)");
  MT_CHECK(src.shape() == shape_, ShapeError, "strided copy of ", src.shape(), " into ", shape_);
  const int64_t n = ndim() ? dim(-1) : 1;
  const int64_t ss = ndim() ? src.stride(-1) : 1, ds = ndim() ? stride(-1) : 1;
  const auto es = static_cast<int64_t>(dtype_size(dtype_));
  const auto ses = static_cast<int64_t>(dtype_size(src.dtype()));
  const char* sb = static_cast<const char*>(src.raw());
  char* db = static_cast<char*>(data_);
  if (same && ss == 1 && ds == 1) {  // dense rows: one memcpy each
    for_each_row(shape_, src.strides(), strides_, [&](int64_t so, int64_t dof) {
      std::memcpy(db + dof * es, sb + so * ses, static_cast<size_t>(n * es));
    });
    return;
  }
  for_each_row(shape_, src.strides(), strides_, [&](int64_t so, int64_t dof) {
    for (int64_t i = 0; i < n; ++i) {
      const char* from = sb + (so + i * ss) * ses;
      char* to = db + (dof + i * ds) * es;
      if (same)
        std::memcpy(to, from, static_cast<size_t>(es));
      else
        store_float(to, dtype_, load_float(from, src.dtype()));
    }
  });
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

double read_scalar(const Tensor& t) {
  MT_CHECK(t.numel() == 1 && (t.dtype() == DType::F64 || t.dtype() == DType::F32), ShapeError,
           "read_scalar of a ", dtype_name(t.dtype()), " tensor ", t.shape());
  double d = 0;
  float f = 0;
  void* host = t.dtype() == DType::F64 ? static_cast<void*>(&d) : static_cast<void*>(&f);
  copy_bytes(host, Device::CPU, t.raw(), t.device(), dtype_size(t.dtype()));
  return t.dtype() == DType::F64 ? d : f;
}

void ensure_scalar(Tensor& t, Device device) {
  if (t.defined() && t.numel() == 1 && t.dtype() == DType::F64 && t.device() == device) return;
  t = Tensor::zeros({1}, DType::F64, device);
}

void expect_shape(const Tensor& t, const Shape& want, const char* what) {
  MT_CHECK(t.shape() == want, ShapeError, what, " has shape ", t.shape(), ", expected ", want);
  MT_CHECK(t.is_contiguous(), ShapeError, what, " is a strided view ", t.shape(), " (strides ",
           t.strides(), "); this op needs contiguous memory");
}

void expect_dims(const Tensor& t, const Shape& want, const char* what) {
  MT_CHECK(t.shape() == want, ShapeError, what, " has shape ", t.shape(), ", expected ", want);
}

}  // namespace mt
