#include "model/param_store.h"

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
    p->value = Tensor::empty(s.shape, s.dtype);
    init_param(s, rng, p->value);
    if (s.role != ParamRole::Buffer && trainable(s)) p->grad = Tensor::zeros(s.shape);
    table[s.name] = ParamRef{p->value, p->grad};
    by_name_[full] = p.get();
    params_.push_back(std::move(p));
  }
  return table;
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
    if (p->trainable()) p->grad.zero_();
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
