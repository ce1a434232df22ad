// A layer case's parameters bound to gradient buffers of its own that start non-zero, as a model's
// do after an earlier micro-batch: a layer that writes (=) a parameter gradient where it must
// accumulate (+=) then fails the op check. After the layer's backward, the increments go to the
// harness's gradient buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "harness/op_check.h"
#include "model/param.h"

namespace mt::test {

class PrefilledGrads {
 public:
  // A table over inputs[first + i] for specs[i]; the specs that `trains` get gradient buffers
  // holding N(0, 1) draws from `seed` (one seed per case, so every backend's pass starts from the
  // same gradients).
  template <typename Trains>
  ParamTable bind(const std::vector<ParamSpec>& specs, const std::vector<Tensor>& inputs,
                  size_t first, uint64_t seed, const Trains& trains) {
    ParamTable table;
    own_.clear();
    prefill_.clear();
    Rng rng(seed);
    for (size_t i = 0; i < specs.size(); ++i) {
      ParamRef ref{.value = inputs[first + i]};
      if (trains(specs[i])) {
        ref.grad = Tensor::empty(specs[i].shape);
        fill_normal(rng, ref.grad);
        prefill_.push_back(ref.grad.clone());
      } else {
        prefill_.emplace_back();
      }
      own_.push_back(ref.grad);
      table[specs[i].name] = ref;
    }
    return table;
  }

  // grads[first + i] += what the layer added to spec i's buffer, for every trained spec.
  void add_increments(std::vector<Tensor>& grads, size_t first) const {
    for (size_t i = 0; i < own_.size(); ++i) {
      if (!own_[i].defined()) continue;
      float* g = grads[first + i].f32();
      const float* mine = own_[i].f32();
      const float* pre = prefill_[i].f32();
      for (int64_t e = 0; e < own_[i].numel(); ++e) g[e] += mine[e] - pre[e];
    }
  }

 private:
  std::vector<Tensor> own_, prefill_;
};

}  // namespace mt::test
