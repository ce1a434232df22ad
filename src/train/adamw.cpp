#include "train/adamw.h"

#include <cmath>

#include "ops/elementwise.h"

namespace mt {

AdamW::AdamW(const ParamStore& store, const AdamWOptions& opt) : opt_(opt) {
  for (const auto& p : store.all()) {
    if (!p->trainable()) continue;
    // Optimizer state lives with the parameter (the GPU's memory for a GPU model).
    const Device dev = p->value.device();
    m_.push_back(Tensor::zeros(p->value.shape(), DType::F32, dev));
    v_.push_back(Tensor::zeros(p->value.shape(), DType::F32, dev));
    master_.push_back(p->value.dtype() == DType::F32
                          ? Tensor()
                          : Tensor::empty(p->value.shape(), DType::F32, dev));
  }
  reset_masters(store);
}

void AdamW::reset_masters(const ParamStore& store) {
  size_t i = 0;
  for (const auto& p : store.all()) {
    if (!p->trainable()) continue;
    if (master_.at(i).defined()) master_[i].copy_from(p->value);
    ++i;
  }
}

double AdamW::step(Context& ctx, ParamStore& store, float lr) {
  // The gradient list and the norm are kept between steps (the store may rebind gradients, so
  // the list is refilled, in place): a step allocates nothing.
  store.grads(grads_);
  ensure_scalar(norm_, ctx.device());
  ops::clip_grad_norm(ctx, grads_, opt_.clip_norm, norm_);
  // Read before the update, not after: a NaN/Inf gradient must be seen before it reaches the
  // weights and moments (the trainer's train.nonfinite policy). Still the step's one read.
  const double norm = read_scalar(norm_);
  if (!std::isfinite(norm)) return norm;
  ++step_;
  const ops::AdamWParams hp = opt_.at(lr, step_);
  size_t i = 0;
  for (const auto& p : store.all()) {
    if (!p->trainable()) continue;
    if (master_[i].defined()) {
      ops::adamw_step(ctx, hp, master_[i], p->grad, m_[i], v_[i]);
      ops::copy(ctx, master_[i], p->value);  // rounds the master into the stored dtype
    } else {
      ops::adamw_step(ctx, hp, p->value, p->grad, m_[i], v_[i]);
    }
    ++i;
  }
  return norm;
}

int64_t AdamW::master_bytes() const {
  int64_t b = 0;
  for (const Tensor& t : master_) b += t.defined() ? static_cast<int64_t>(t.bytes()) : 0;
  return b;
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < m_.size(); ++i) b += static_cast<int64_t>(m_[i].bytes() + v_[i].bytes());
  return b;
}

}  // namespace mt
