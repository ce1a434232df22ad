#include "model/param.h"

namespace mt {

ParamRef need_param(const ParamTable& table, const std::string& name, const Shape& shape) {
  auto it = table.find(name);
  MT_CHECK(it != table.end(), ConfigError, "missing parameter '", name, "' ", shape);
  MT_CHECK(it->second.value.shape() == shape, ShapeError, "parameter '", name, "' has shape ",
           it->second.value.shape(), ", expected ", shape);
  MT_CHECK(!it->second.grad.defined() || it->second.grad.shape() == shape, ShapeError,
           "gradient of '", name, "' has shape ", it->second.grad.shape(), ", expected ", shape);
  return it->second;
}

ParamRef optional_param(const ParamTable& table, const std::string& name, const Shape& shape) {
  return table.count(name) ? need_param(table, name, shape) : ParamRef{};
}

DType param_dtype(const ParamSpec& spec, const Precision& precision) {
  return spec.role == ParamRole::Buffer || spec.keep_fp32 ? DType::F32 : precision.weights;
}

void init_param(const ParamSpec& spec, Rng& rng, Tensor& t) {
  if (t.dtype() != DType::F32) {
    Tensor wide = Tensor::empty(t.shape());
    init_param(spec, rng, wide);
    t.copy_from(wide);
    return;
  }
  float* p = t.f32();
  switch (spec.init) {
    case ParamInit::Normal:
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(spec.std * rng.normal());
      break;
    case ParamInit::Zeros:
      t.zero_();
      break;
    case ParamInit::Ones:
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = 1.0f;
      break;
    case ParamInit::Custom:
      MT_CHECK(spec.custom != nullptr, InternalError, "parameter '", spec.name,
               "' has no initialiser");
      spec.custom(rng, t);
      break;
  }
}

}  // namespace mt
