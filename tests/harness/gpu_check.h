// GPU-vs-CPU checks for CUDA ops (tests/cuda): each case runs the CPU op in fp32, then the GPU
// op twice: on f32 tensors (same arithmetic, another summation order) and on bf16 tensors (the
// GPU's training precision), against bounds from harness/tolerance.h. Outputs are poisoned with
// NaN before every GPU run, inputs are fresh random draws (the seed is printed), and parameter
// gradients are pre-filled so that overwriting instead of accumulating shows.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/device.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace mt::test {

// Every GPU test starts with this: without a GPU (or without the CUDA backend) it skips, saying so.
#define REQUIRE_GPU()          \
  if (!::mt::cuda_available()) \
  GTEST_SKIP() << "no GPU visible (or built without CUDA): CUDA op check skipped"

// Selects the CPU entry or its CUDA twin (same signature), for the Run of a case.
#define OP(name) (gpu ? &::mt::ops::cuda::name : &::mt::ops::name)

uint64_t fresh_seed();  // harness/seed.h test_seed()

struct In {
  Tensor host;       // f32 or an integer type, on the CPU
  bool lowp = true;  // stored as bf16 in the bf16 pass (activations, weights)
};

// Runs the op on the tensors it is given (all on the CPU or all on the GPU) and returns every
// result to compare: outputs, activation gradients and accumulated parameter gradients.
using Run = std::function<std::vector<Tensor>(Context&, const std::vector<Tensor>&, bool gpu)>;

Tensor randn(Rng& rng, Shape s, double scale = 1.0);
// A result buffer on the context's device, filled with NaN so that unwritten elements show.
Tensor out(Context& ctx, const Shape& s, DType dt);
// A copy of `t` on the context's device (pre-filled accumulators, in-place operands).
Tensor like(Context& ctx, const Tensor& t);
// The bytes of a tensor on any device, for bit-for-bit comparisons.
std::vector<uint8_t> host_bytes(const Tensor& t);
// An f32 tensor rounded to bf16 (to nearest even, as the GPU stores), as f32; others unchanged.
Tensor round_bf16(const Tensor& t);
// The CPU pass, the GPU f32 pass and the GPU bf16 pass; `names` label the results.
// `reduction_terms`: the longest sum the op computes, which sets the f32 bound (tolerance.h).
// `bf16_emulation`: the CPU run that sets the bf16 bound, for an op whose GPU path stores
// intermediates in bf16 that `run` on the CPU keeps in fp32 (it rounds them at the same points);
// by default `run` itself, which rounds only the inputs and the outputs.
void run_case(const char* name, const std::vector<In>& ins, const std::vector<std::string>& names,
              const Run& run, uint64_t seed, int64_t reduction_terms = 0,
              const Run& bf16_emulation = {});

}  // namespace mt::test
