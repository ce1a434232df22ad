// The one table of GPU-vs-CPU tolerances. Every CUDA op check compares the GPU result with the CPU
// engine's fp32 result on the same inputs (the CPU op is itself checked against a double
// reference and finite differences in tests/ops), by norm-wise relative error. Two places use it:
// check_op's device pass (every OpCase, f32 tensors) and tests/cuda (f32 and bf16 passes).
//
// | pass | bound on rel_err(gpu, cpu_fp32)                                   | why |
// |------|-------------------------------------------------------------------|--------------------------|
// | f32  | kF32Rel = 1e-5                                                    | both fp32, only the
// | |      |                                                                   | summation order
// differs: | |      |                                                                   | ~sqrt(n)
// ulp for n<=1e4  | | bf16 | kBf16Multiple * e_emul + kBf16Floor, where e_emul =               |
// the GPU may round where  | |      | rel_err(bf16(cpu_fp32(bf16(inputs))), cpu_fp32(inputs)): the
// CPU  | the emulation rounds (in | |      | op with bf16 rounding of its inputs and outputs | and
// out) plus at most as | |      | | much again inside        |
//
// kBf16Multiple = 2 follows flash-attention's rule (a kernel's error at most twice that of the
// same computation in the same precision); kBf16Floor covers outputs that bf16 represents exactly.
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

}  // namespace mt::test
