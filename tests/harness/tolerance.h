// The one table of GPU-vs-CPU tolerances. Every CUDA check compares the GPU result with the CPU
// engine's fp32 result on the same inputs (the CPU is itself checked against a double reference
// and finite differences in tests/ops and tests/model), by norm-wise relative error. Op rows serve
// check_op's device pass (every OpCase, f32 tensors) and tests/cuda (f32 and bf16 passes); model
// rows serve tests/cuda/test_cuda_model.cpp (a whole forward and backward).
//
// clang-format off
// | check        | bound on rel_err(gpu, cpu_fp32)          | why                                   |
// |--------------|------------------------------------------|---------------------------------------|
// | op, f32      | f32_bound(terms) >= kF32Rel = 1e-5        | both fp32; only the summation order   |
// |              |                                          | differs: ~sqrt(n) ulp per sum         |
// | op, bf16     | kBf16Multiple * e_emul + kBf16Floor,      | the GPU may round where the emulation |
// |              | e_emul = rel_err(bf16(cpu(bf16(in))),    | rounds (in and out) plus at most as   |
// |              |                  cpu(in))                | much again inside (flash-attention's  |
// |              |                                          | rule: twice the same-precision error) |
// | model, f32   | kModelF32Rel = 1e-3                      | ~60 ops in a chain of the 5-layer     |
// |              |                                          | test model, each within ~1e-5, errors |
// |              |                                          | amplified by the norms' 1/rms (<= 10) |
// | model, bf16  | loss kModelBf16LossRel = 1e-2,           | every stored activation rounds to     |
// |              | gradient kModelBf16GradRel = 6e-2        | bf16 (u = 2^-9): ~100 roundings along |
// |              |                                          | a path add in quadrature (10u = 2e-2),|
// |              |                                          | times kBf16Multiple, plus a routing / |
// |              |                                          | top-k near-tie flip's share           |
// clang-format on
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mt::test {

inline constexpr double kF32Rel = 1e-5;
// The f32 bound of a case whose longest sum has `terms` terms: two fp32 implementations that sum
// in different orders each err by about sqrt(terms) units of roundoff (2^-24), products add as
// much again, hence 4 sqrt(terms) 2^-24, and never below kF32Rel (which alone covers sums of up to
// ~1700 terms).
inline double f32_bound(int64_t terms) {
  return std::max(kF32Rel, 4.0 * std::sqrt(static_cast<double>(terms)) * 0x1p-24);
}
inline constexpr double kBf16Multiple = 2.0;
inline constexpr double kBf16Floor = 1e-6;

inline constexpr double kModelF32Rel = 1e-3;
inline constexpr double kModelBf16LossRel = 1e-2;
inline constexpr double kModelBf16GradRel = 6e-2;

}  // namespace mt::test
