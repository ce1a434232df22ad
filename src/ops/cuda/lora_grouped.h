// Skinny grouped products: the grouped_matmul calls of expert LoRA, where one dimension is the
// adapter rank r (at most 64, a multiple of 8). On CUTLASS's 128 x 256 x 64 tiles or cuBLAS's
// grouped GEMM such a call wastes most of every tile, and the bf16 weight-gradient form went group
// by group through cuBLASLt; these are mma.sync (m16n8k16, bf16, fp32 accumulation) kernels, one
// launch per call across all groups, that read the large operand once:
//   down: C_g = alpha X_g W_g^T (XWt, W_g [r, K]) or alpha X_g W_g (DyW, W_g [K, r]): C [rows, r];
//   up:   C_g = alpha S_g W_g^T + beta C_g (XWt, W_g [n, r]) or alpha S_g W_g (DyW, W_g [r, n]),
//         S [rows, r];
//   dW:   dW_g = alpha A_g^T B_g + beta dW_g (DytX) with A [rows, r] (dW_g [r, K]) or B [rows, r]
//         (dW_g [n, r]), f32. The rows of a group are split over blocks whose partial sums meet
//         through f32 atomics; a deterministic context gives each group's rows to one block, which
//         sums them in row order (bit-repeatable, at less parallelism for a hot expert).
// ops/cuda/grouped_matmul.cu calls this first for bf16 operands; it declines (false) whatever
// it does not take (f32, r > 64 or not a multiple of 8, rows or widths not 16-byte aligned, a down
// product with beta != 0, more than kMaxGroups non-empty groups), and the call goes on to
// CUTLASS or cuBLAS.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/grouped_matmul.h"

namespace mt::ops::cuda {

// The widest rank the skinny kernels take.
constexpr int64_t kSkinnyMaxRank = 64;

// Runs grouped_matmul(ctx, p, a, offsets, b, c) (validated by the caller, offsets on the host)
// on the skinny kernels and returns true, or returns false having done nothing. The caller has
// already scaled the weight-gradient blocks of empty groups by beta.
bool skinny_grouped_matmul(Context& ctx, const GroupedMatmulParams& p, const Tensor& a,
                           const Tensor& offsets, const Tensor& b, Tensor& c);

// Expert LoRA's backward products that read the output gradient dOut [rows, K] (B [G, K, r],
// xa [rows, r], both bf16), in one pass over it: dr = s dOut_g B_g (written) and, when db is
// defined, dB_g += s dOut_g^T xa_g (f32). Returns false having done nothing when it does not take
// the call (a deterministic context: dB meets through atomics; r > 32; what the skinny kernels
// refuse); the caller then runs the two grouped_matmul calls. Blocks of 128 rows; `s13`
// (GroupedFfnParams::lora_s13_kernels) keeps `regs` off; `regs` (without s13): dr's fragments
// formed in registers, dB from a shared tile (LoraKernels::Registers).
bool skinny_lora_out_grads(Context& ctx, const Tensor& dout, const Tensor& offsets, const Tensor& b,
                           const Tensor& xa, float s, Tensor& dr, Tensor& db, bool s13 = false,
                           bool regs = false);

// The gate/up projection's adapter term and SwiGLU in one pass after the base GEMM wrote gate_up
// [rows, 2F] (bf16, B [G, 2F, r], xa [rows, r]): h [rows, F] = silu(g) * u with [g | u] = gate_up
// + s xa B^T rounded to bf16; gate_up is left as it is. False having done nothing when it does not
// take the call (what the skinny kernels refuse); the caller then runs the composite form.
bool skinny_lora_swiglu(Context& ctx, const Tensor& xa, const Tensor& offsets, const Tensor& b,
                        float s, const Tensor& gate_up, Tensor& h);

// Its backward in one pass (ops/grouped_ffn.h, grouped_ffn_lora_swiglu_backward): dgate_up from
// the same [g | u] and dh + dr A_down (dr [rows, r], A_down [G, r, F], bf16). False having done
// nothing when it does not take the call.
bool skinny_lora_swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& xa,
                                 const Tensor& offsets, const Tensor& b, const Tensor& dh,
                                 const Tensor& dr, const Tensor& a_down, float s, Tensor& dgate_up);

// grouped_ffn_lora_swiglu_backward_grads (ops/grouped_ffn.h) in one pass over gate_up and dh
// (bf16 rows; B_gu [G, 2F, r] bf16; dB_gu, dA_down f32 or undefined): staged through shared
// memory, or with `regs` the fragments formed in registers (LoraKernels). False having done
// nothing when it does not take the call (a deterministic context: dB and dA meet through atomics;
// r > 32; what the skinny kernels refuse); the caller then runs the composite form.
bool skinny_lora_swiglu_bwd_grads(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                  const Tensor& offsets, const Tensor& dr_down, const Tensor& xa,
                                  const Tensor& b_gu, float s, Tensor& dgate_up, Tensor& dr_gu,
                                  Tensor& db_gu, Tensor& da_down, bool regs = false);

// grouped_ffn_lora_swiglu_ha (ops/grouped_ffn.h) in one pass over gate_up (bf16 rows, A_down
// [G, r, F] bf16): staged through shared memory, or with `regs` the fragments formed in registers
// (LoraKernels). False having done nothing when it does not take the call.
bool skinny_lora_swiglu_ha(Context& ctx, const Tensor& gate_up, const Tensor& offsets,
                           const Tensor& a_down, Tensor& h, Tensor& ha, bool regs = false);

// grouped_ffn_lora_xa (ops/grouped_ffn.h): xa [rows, r] = X A_g^T (X bf16 rows [rows, K], A
// [G, r, K] bf16), one pass over X with the fragments formed in registers (swiglu_ha_regs_kernel
// without SwiGLU). False having done nothing when it does not take the call.
bool skinny_lora_xa(Context& ctx, const Tensor& x, const Tensor& offsets, const Tensor& a,
                    Tensor& xa);

// grouped_ffn_lora_pack (ops/grouped_ffn.h) in one launch: A_gu, s B_gu into w_gu's padded
// buffer and A_d, s B_d into w_d's (the W blocks, bf16), the factors bf16 or f32. False having
// done nothing when it does not take the call (other types, rows not 16-byte aligned).
bool skinny_lora_pack(Context& ctx, float s, const Tensor& a_gu, const Tensor& b_gu,
                      const Tensor& w_gu, const Tensor& a_d, const Tensor& b_d, const Tensor& w_d);

}  // namespace mt::ops::cuda
