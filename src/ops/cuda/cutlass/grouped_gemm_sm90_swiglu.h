// The down projection's input gradient with SwiGLU's backward in its epilogue
// (grouped_gemm_sm90.h's InputGrad form, experts without LoRA): per group, dh_g = dY_g W_g is never
// stored; the epilogue reads the saved pre-activations [g | u] of the group's rows and writes
// dgate_up's [dg | du], dg = dh u s (1 + g (1 - s)), du = dh g s, s = sigmoid(g), and where asked
// h = g s u (for the down projection's weight gradient). g arrives as the GEMM's C (TMA, per-group
// tensor maps) and dg leaves as its D; u, du and h move through registers with predicated 4-16
// byte accesses. Two compiled configurations: the forward forms' default tile and cluster, and
// ping-pong 128 x 128 x 64 with a cluster of two along M where the configuration's input-gradient
// kernel is pingpong128x128c2x1 (Sm90Config::dx_kernel, else kernel). Declared apart from
// grouped_gemm_sm90.h so that the other kernels' files do not see it.
#pragma once

#include "ops/cuda/cutlass/grouped_gemm_sm90.h"

namespace mt::ops::cuda {

struct Sm90SwigluGrad {
  const void* dy = nullptr;  // bf16 rows [rows, k]
  int64_t ld_dy = 0;
  const void* w = nullptr;        // bf16 W_g [k, n] (N-major) in [G, k, n]
  int64_t ldw = 0, w_group = 0;   // 0: contiguous
  const void* gate_up = nullptr;  // bf16 [rows, 2n]: g, then u
  int64_t ld_gate_up = 0;
  void* dgate_up = nullptr;  // bf16 [rows, 2n]: dg, then du
  int64_t ld_dgate_up = 0;
  void* h = nullptr;  // bf16 [rows, n], or nullptr: not written
  int64_t ld_h = 0;
  int64_t n = 0, k = 0;
};

// Whether the fused kernel takes the call: 16-byte aligned bases and row pitches, n and k multiples
// of 8.
bool sm90_swiglu_grad_fits(const Sm90SwigluGrad& g, int count);
size_t sm90_swiglu_grad_scratch(const Sm90SwigluGrad& g, const GroupRows& rows, int count,
                                const Sm90Launch& at);
// nullptr, or what failed.
const char* sm90_swiglu_grad(const Sm90SwigluGrad& g, const GroupRows& rows, int count,
                             const Sm90Launch& at, void* scratch);

}  // namespace mt::ops::cuda
