// The grouped expert GEMMs with the grouped FFN's SwiGLU in their epilogues (ops/cuda/cutlass/
// grouped_gemm_sm90_swiglu.h), for ops/cuda/grouped_ffn.cu's bodies of grouped_ffn_gate_up_swiglu
// and grouped_ffn_down_swiglu_backward (ops/grouped_ffn.h). Each returns false, having launched
// nothing, where the CUTLASS path refuses the operands (types, alignment, more groups than one
// launch takes); the caller then runs the separate passes.
#pragma once

#include "core/context.h"
#include "core/tensor.h"
#include "ops/grouped_matmul.h"

namespace mt::ops::cuda {

// gate_up = X W_gu^T (W_gu [G, 2F, in]) and h = swiglu(gate_up): the g half by the plain grouped
// GEMM (cfg's forward kernel), the u half by the fused one, which writes h.
bool grouped_gate_up_swiglu(Context& ctx, const GroupedGemmConfig& cfg, const Tensor& x,
                            const Tensor& offsets, const Tensor& w_gu, Tensor& gate_up, Tensor& h);

// The same with W_gu's rows interleaved in blocks of 16 (GroupedFfnParams::interleaved_gate_up):
// one GEMM, whose epilogue holds each tile's g and u columns, writes gate_up (interleaved) and h.
bool grouped_gate_up_swiglu_interleaved(Context& ctx, const GroupedGemmConfig& cfg, const Tensor& x,
                                        const Tensor& offsets, const Tensor& w_gu, Tensor& gate_up,
                                        Tensor& h);

// dgate_up = SwiGLU'(gate_up) (dY W_down) (W_down [G, out, F]), and h = swiglu(gate_up) where
// `h` is defined; one launch, dh never written.
bool grouped_down_swiglu_backward(Context& ctx, const GroupedGemmConfig& cfg, const Tensor& dy,
                                  const Tensor& offsets, const Tensor& w_down,
                                  const Tensor& gate_up, Tensor& dgate_up, const Tensor& h);

// The K-concatenation forward's gate/up projection with xa = X A_gu^T formed in the GEMM's mainloop
// (grouped_ffn_lora_gate_up, GroupedFfnParams::lora_xa == Gemm): gate_up = [X | xa] w_gu^T over
// xp [rows, in + r] (X its first `in` columns; xa written into the rest), w_gu [E, 2F, in + r] the
// gate/up block of the padded buffer, whose rows 2F .. 2F + r - 1 beyond the block hold A_gu
// (grouped_ffn_lora_pack). Rank 16 and `in` a multiple of 64 (ops/cuda/cutlass/
// grouped_gemm_sm90.h, sm90_lora_xa_gemm).
// With h (the interleaved gate/up layout, GroupedFfnParams::interleaved_gate_up) the epilogue also
// writes h = silu(g) u [rows, F] (bf16, 16-byte rows; 2F a multiple of 32).
bool grouped_gate_up_lora_xa(Context& ctx, const Tensor& xp, const Tensor& offsets,
                             const Tensor& w_gu, int64_t rank, Tensor& gate_up,
                             Tensor* h = nullptr);

// A K-concatenated projection's backward with dr = dOut (s B) formed in the dX GEMM's mainloop and
// dB += s dOut^T R from the dOut tiles it holds (grouped_ffn_lora_dx, GroupedFfnParams::lora_dr ==
// Gemm): dX = [dOut | dr] [W ; A] over dyp [rows, w + r] (dOut its first w columns; dr written
// into the rest), w_dx [E, w + r, in] the padded buffer's input-gradient view (its columns in ..
// in + r - 1 hold s B, grouped_ffn_lora_pack), R [rows, r] (ha for the down projection, xa for
// the gate/up one), db [E, w, r] f32 (added into). Rank 16 and w a multiple of 128 (ops/cuda/
// cutlass/grouped_gemm_sm90.h, sm90_lora_dr_gemm).
bool grouped_dx_lora_dr(Context& ctx, const Tensor& dyp, const Tensor& offsets, const Tensor& w_dx,
                        int64_t rank, const Tensor& r_rows, float scale, Tensor& db, Tensor& dx);

}  // namespace mt::ops::cuda
