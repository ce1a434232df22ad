// Inputs of the KDA core checks on the GPU (test_cuda_kda.cpp, test_cuda_kda_tc.cpp): key rows
// as the layer feeds them and log decays from mild to as strong as the layer's gate makes them.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "harness/gpu_check.h"
#include "ref/activation_ref.h"

namespace mt::test {

// Unit-norm key rows (as the layer feeds them): the delta rule is then a contraction.
inline Tensor unit_rows(Rng& rng, const Shape& s) {
  Tensor t = randn(rng, s);
  const int64_t K = t.dim(-1), rows = t.numel() / K;
  float* p = t.f32();
  for (int64_t r = 0; r < rows; ++r) {
    double n = 0;
    for (int64_t i = 0; i < K; ++i) n += double(p[r * K + i]) * p[r * K + i];
    for (int64_t i = 0; i < K; ++i) p[r * K + i] = static_cast<float>(p[r * K + i] / std::sqrt(n));
  }
  return t;
}

// One log decay: mild (the state survives chunks) or as strong as the layer's gate makes it.
inline float log_decay_value(Rng& rng, bool strong) {
  return strong
             ? static_cast<float>(-rng.uniform(1.0, 16.0) * ref::softplus(2.0 * rng.normal() + 1.0))
             : static_cast<float>(-std::log1p(std::exp(-(1.5 * rng.normal() + 2.0))));
}

// Log decays [T, H, K], all mild or all strong.
inline Tensor log_decay(Rng& rng, const Shape& s, bool strong) {
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = log_decay_value(rng, strong);
  return t;
}

// beta [T, H] in (0, 1), as the layer's sigmoid gives it.
inline Tensor random_beta(Rng& rng, int64_t T, int64_t H) {
  Tensor beta = Tensor::empty({T, H});
  for (int64_t i = 0; i < beta.numel(); ++i)
    beta.f32()[i] = static_cast<float>(ref::sigmoid(rng.normal()));
  return beta;
}

// The inputs of a KDA case in the order the checks pass them: cu_seqlens, q, k, v, g, beta, h0,
// dout, dhT. q, k, v and dout are stored in the op's type; g, beta and the states stay f32.
// `decay` draws g [T, H, K] (between v and beta, so that a case's draws keep their order).
inline std::vector<In> kda_inputs(Rng& rng, const Tensor& cu_seqlens, int64_t T, int64_t N,
                                  int64_t H, int64_t K, int64_t V,
                                  const std::function<Tensor(Rng&, const Shape&)>& decay) {
  Tensor beta = random_beta(rng, T, H);
  return {{cu_seqlens, false},
          {randn(rng, {T, H, K})},
          {unit_rows(rng, {T, H, K})},
          {randn(rng, {T, H, V})},
          {decay(rng, {T, H, K}), false},
          {beta, false},
          {randn(rng, {N, H, K, V}, 0.5), false},
          {randn(rng, {T, H, V})},
          {randn(rng, {N, H, K, V}), false}};
}

}  // namespace mt::test
