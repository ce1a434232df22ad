#include "model/param_store.h"

#include <algorithm>
#include <cstring>

#include "core/device.h"

namespace mt {

ParamTable ParamStore::add_layer(const std::string& prefix, const std::vector<ParamSpec>& specs,
                                 Rng& rng, const std::function<bool(const ParamSpec&)>& trainable) {
  ParamTable table;
  for (const ParamSpec& s : specs) {
    std::string full = prefix + s.name;
    MT_CHECK(!by_name_.count(full), InternalError, "parameter '", full, "' declared twice");
    auto p = std::make_unique<Param>();
    p->name = full;
    p->spec = s;
    constexpr int64_t kTileAbove = int64_t{1} << 24, kTile = int64_t{1} << 20;
    const bool weight = s.role == ParamRole::Dense || s.role == ParamRole::Expert;
    if (deferred_ && weight && s.init != ParamInit::Custom) {
      // Normal draws take two counters per element (Rng::normal); the others take none.
      if (s.init == ParamInit::Normal)
        rng = Rng(rng.seed(), rng.counter() + 2 * static_cast<uint64_t>(s.shape.numel()));
      p->value = Tensor(nullptr, s.shape, s.dtype, device_);
      // Untouched until the mesh replaces it with its slice's (or zeroes the whole one it keeps).
      if (trainable(s)) p->grad = Tensor::empty(s.shape, DType::F32, device_);
      table[s.name] = p->ref();
      by_name_[full] = p.get();
      params_.push_back(std::move(p));
      continue;
    }
    if (tiled_init_ && s.init == ParamInit::Normal && s.shape.numel() > kTileAbove) {
      // One block of draws, copied into place and then doubled on the device itself.
      Tensor wide = Tensor::empty({kTile});
      for (int64_t i = 0; i < kTile; ++i) wide.f32()[i] = static_cast<float>(s.std * rng.normal());
      Tensor tile = Tensor::empty({kTile}, s.dtype);
      tile.copy_from(wide);
      p->value = Tensor::empty(s.shape, s.dtype, device_);
      const size_t es = dtype_size(s.dtype), n = static_cast<size_t>(s.shape.numel());
      char* base = static_cast<char*>(p->value.raw());
      copy_bytes(base, device_, tile.raw(), Device::CPU, static_cast<size_t>(kTile) * es);
      for (size_t done = kTile; done < n; done *= 2)
        copy_bytes(base + done * es, device_, base, device_, std::min(done, n - done) * es);
    } else {
      p->value = Tensor::empty(s.shape, s.dtype);
      init_param(s, rng, p->value);
      if (device_ != Device::CPU) p->value = p->value.to(device_);
    }
    if (s.role != ParamRole::Buffer && trainable(s))
      p->grad = Tensor::zeros(s.shape, DType::F32, device_);
    table[s.name] = p->ref();
    by_name_[full] = p.get();
    params_.push_back(std::move(p));
  }
  return table;
}

void ParamStore::to_device(Device device) {
  if (device == device_) return;
  for (auto& p : params_) {
    p->value = p->value.to(device);
    if (p->grad.defined()) p->grad = p->grad.to(device);
  }
  device_ = device;
}

Param& ParamStore::at(const std::string& name) {
  auto it = by_name_.find(name);
  MT_CHECK(it != by_name_.end(), ConfigError, "no parameter named '", name, "'");
  return *it->second;
}

const Param* ParamStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void ParamStore::zero_grad() {
  for (auto& p : params_)
    if (p->trainable()) {
      p->grad.zero_();
      p->grad_zero = true;
    }
}

int64_t ParamStore::count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (!trainable_only || p->trainable()) n += p->value.numel();
  return n;
}

std::vector<Tensor> ParamStore::grads() const {
  std::vector<Tensor> g;
  grads(g);
  return g;
}

void ParamStore::grads(std::vector<Tensor>& out) const {
  out.clear();
  for (const auto& p : params_)
    if (p->trainable()) out.push_back(p->grad);
}

}  // namespace mt
