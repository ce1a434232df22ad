// AdamW over every trainable parameter of a ParamStore: fp32 first/second moments allocated only
// for trainable parameters (frozen base weights cost nothing), global gradient-norm clipping.
// A trainable parameter stored narrower than fp32 (a bf16 policy, model/precision.h) also gets an
// fp32 master: the step updates the master and rounds it into the stored value.
#pragma once

#include <vector>

#include "core/context.h"
#include "model/param_store.h"
#include "ops/optim.h"

namespace mt {

using AdamWOptions = ops::AdamWOptions;

class AdamW {
 public:
  AdamW(const ParamStore& store, const AdamWOptions& opt);
  // Clips, then updates every trainable parameter with learning rate lr. Returns the gradient
  // norm before clipping. A non-finite norm (a NaN/Inf gradient) is returned without any update:
  // values, moments and the step count stay as they were.
  double step(Context& ctx, ParamStore& store, float lr);
  int64_t steps() const { return step_; }
  int64_t state_bytes() const;   // the moments
  int64_t master_bytes() const;  // the fp32 masters (0 when every parameter is stored fp32)
  // Moments in store order of the trainable parameters, for checkpoints.
  std::vector<Tensor>& first_moments() { return m_; }
  std::vector<Tensor>& second_moments() { return v_; }
  const std::vector<Tensor>& first_moments() const { return m_; }
  const std::vector<Tensor>& second_moments() const { return v_; }
  // fp32 masters in the same order; an undefined tensor where the value itself is fp32.
  std::vector<Tensor>& masters() { return master_; }
  const std::vector<Tensor>& masters() const { return master_; }
  // Re-reads every master from its stored value (after the values were loaded from elsewhere).
  void reset_masters(const ParamStore& store);
  void set_steps(int64_t s) { step_ = s; }

 private:
  AdamWOptions opt_;
  int64_t step_ = 0;
  std::vector<Tensor> m_, v_;  // one pair per trainable parameter, in store order
  std::vector<Tensor> master_;
  std::vector<Tensor> grads_;  // the store's trainable gradients, refilled each step
  Tensor norm_;                // f64 [1]: the gradient norm before clipping
};

}  // namespace mt
