// The grouped FFN's SwiGLU in the epilogue of a grouped expert GEMM (issue 14), on the
// cooperative 128 x 256 x 64 kernel with a cluster of 2 x 1 (grouped_gemm_sm90.h's default), or on
// ping-pong 128 x 128 x 64 (cluster 2 x 1) where the form's configured kernel is
// pingpong128x128c2x1 (Sm90Config: kernel for Up, dx_kernel for Down backward).
// gate_up = [g | u] keeps the model's layout: a tile of the GEMM sees columns j .. j + 255 of one
// half only, so the other half comes to the epilogue as its C source (TMA, per group, prefetched
// by the producer warp) and through direct loads and stores of the thread's own elements.
//
//   Up (the gate/up projection's second half, after the first wrote g = X W_g^T into gate):
//     u = A_g W_g^T is written to c (bf16, as the plain GEMM rounds it) and h = silu(g) u to h,
//     with g read from gate (the same rows). gate_up's g half is one plain GEMM (n = F) before.
//   Down backward (dh = dY W_down never written): the epilogue reads g from gate and u from
//     gate + n, and writes dg to c, du to c + n and, when h is set, h = silu(g) u.
//   UpInterleaved (W_gu's rows interleaved in blocks of 16, g then u: ops/grouped_ffn.h,
//     GroupedFfnParams::interleaved_gate_up): one GEMM over all 2F rows (n = 2F, a multiple of 32)
//     writes gate_up in that layout to c; each 32-column sub-tile of its epilogue holds 16 g
//     columns and their 16 u columns, from which it writes h = silu(g) u (16 columns of h) to h.
//     No C source (gate unused); the cooperative kernel only.
// Up's h is formed from u rounded to bf16 (UpInterleaved's from g and u so rounded), as gate_up
// keeps them; Down backward takes dh in f32 from
// the accumulators (the separate passes read it back in bf16); the sigmoid takes the fast
// exponential and division (a few f32 ulp). alpha 1, beta 0.
//
// A separate file from grouped_gemm_sm90.h so that its declarations do not rebuild the other
// configurations' minute-long CUTLASS compiles.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cuda/cutlass/grouped_gemm_sm90.h"

namespace mt::ops::cuda {

enum class Sm90SwigluForm { Up, DownBackward, UpInterleaved };

// g.form: Forward for Up and UpInterleaved, InputGrad for DownBackward (g.alpha, g.beta ignored).
// gate: the rows' g half (its u half follows n columns on), row pitch ldgate (UpInterleaved:
// unused); h: [rows, n] (UpInterleaved: [rows, n / 2]) at row pitch ldh, null for none (the Up
// forms require it).
struct Sm90Swiglu {
  Sm90SwigluForm form = Sm90SwigluForm::Up;
  const void* gate = nullptr;
  int64_t ldgate = 0;
  void* h = nullptr;
  int64_t ldh = 0;
  // The direct loads and stores as each thread's 4-byte pairs, not the quad's 16-byte parts.
  bool narrow = false;
};

// Whether the fused kernel takes the call: sm90_grouped_fits' rules, and 16-byte aligned gate
// and h rows (UpInterleaved: n a multiple of 32, no gate).
bool sm90_swiglu_fits(const Sm90Grouped& g, const Sm90Swiglu& s, int count);
size_t sm90_swiglu_scratch(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows,
                           int count, const Sm90Launch& at);
// As sm90_grouped_gemm: nullptr, or what failed.
const char* sm90_swiglu_gemm(const Sm90Grouped& g, const Sm90Swiglu& s, const GroupRows& rows,
                             int count, const Sm90Launch& at, void* scratch);

}  // namespace mt::ops::cuda
