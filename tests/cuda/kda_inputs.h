// Inputs of the KDA core checks on the GPU (test_cuda_kda.cpp, test_cuda_kda_tc.cpp): key rows
// as the layer feeds them and log decays from mild to as strong as the layer's gate makes them.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "harness/gpu_check.h"
#include "ops/kda.h"
#include "ops/kda_prep_path.h"
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

// One KDA forward + backward on the inputs of kda_inputs (cu_seqlens first; h0 and dhT only where
// `h0` / `dhT`), on the GPU or the CPU: o, hT, saved, dq, dk, dv, dg, dbeta, dh0. Forward keeps
// for backward what the model keeps (KdaLayer, ops/kda_prep_path.h): the chunk states in
// kda_saved_dtype (bf16 on the tensor-core path), the prepared blocks only with
// p.kernels.keep_prepared on the GPU. `prepared_out` (GPU, kept blocks only): that block as
// backward leaves it, holding backward's products. `round_states` (CPU): the chunk states rounded
// to bf16 between forward and backward, where the GPU stores them so (the bf16 bound's emulation,
// harness/gpu_check.h: the rounding the design adds, applied where the design applies it).
inline std::vector<Tensor> kda_forward_backward(const ops::KdaParams& p, int64_t rows, bool h0,
                                                bool dhT, Context& c, const std::vector<Tensor>& in,
                                                bool gpu, bool round_states = false,
                                                Tensor* prepared_out = nullptr) {
  const int64_t T = p.tokens, N = p.num_seqs, H = p.heads, K = p.head_k, V = p.head_v;
  const DType dt = in[1].dtype();
  const Tensor h0t = h0 ? in[6] : Tensor(), dhTt = dhT ? in[8] : Tensor();
  Tensor o = out(c, {T, H, V}, dt), hT = out(c, {N, H, K, V}, DType::F32);
  Tensor saved = out(c, {rows, H, K, V}, ops::kda_saved_dtype(c.device(), p, dt));
  const bool keep = gpu && ops::kda_chunk_kernel_fits(p) && p.kernels.keep_prepared;
  EXPECT_TRUE(keep || !prepared_out) << "the backward's products asked of a block not kept";
  Tensor prepared = keep ? out(c, {ops::kda_prepared_floats(p, rows, dt)}, DType::F32) : Tensor();
  OP(kda_forward)(c, p, in[0], in[1], in[2], in[3], in[4], in[5], h0t, o, hT, saved, prepared);
  if (round_states && !gpu) saved = round_bf16(saved);
  Tensor dq = out(c, {T, H, K}, dt), dk = out(c, {T, H, K}, dt), dv = out(c, {T, H, V}, dt);
  Tensor dg = out(c, {T, H, K}, DType::F32), dbeta = out(c, {T, H}, DType::F32);
  Tensor dh0 = out(c, {N, H, K, V}, DType::F32);
  OP(kda_backward)
  (c, p, in[0], in[1], in[2], in[3], in[4], in[5], saved, prepared, in[7], dhTt, dq, dk, dv, dg,
   dbeta, dh0);
  if (prepared_out) *prepared_out = prepared;
  return {o, hT, saved, dq, dk, dv, dg, dbeta, dh0};
}

}  // namespace mt::test
