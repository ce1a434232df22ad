// Routed SwiGLU experts over rows already sorted by expert (ops/moe_dispatch.h): expert e owns
// rows [offsets[e], offsets[e+1]) of x and computes, with one grouped_matmul per projection,
//   gu = X_e Wgu_e^T,  h = silu(gu[:, :F]) * gu[:, F:],  y = h Wd_e^T.
// Weights use the transformers-v5 fused layout: gate_up [E, 2F, in] (rows 0..F-1 gate, F..2F-1
// up), down [E, in, F]. Optional per-expert LoRA (rank r, scale alpha / r) on both projections,
// applied as (X A^T) B^T so Delta W = B A is never formed:
//   gate_up_a [E, r, in], gate_up_b [E, 2F, r], down_a [E, r, F], down_b [E, in, r].
// On the GPU the rank-r products run on skinny kernels (ops/cuda/lora_grouped.h, through
// grouped_matmul), and the LoRA term is written before the base GEMM adds into it.
//
// K-concatenation (bf16 on the GPU, grouped_ffn_kconcat): the adapter rides in the base GEMMs' K
// dimension instead, y = X W^T + (X A^T)(s B)^T = [X | X A^T] [W | s B]^T and dX = dY W + (s dY B)
// A = [dY | s dY B] [W ; A]. Each projection's base weight then lives inside a padded buffer
// [E, out + r, in + r] = [[W, s B], [A, 0]], rows grouped_ffn_row_pitch(in, r) apart
// (grouped_ffn_pad_weight; the op copies A and s B into the pads at every forward), and the
// activations that feed a GEMM carry the rank-r product in r extra columns: X [rows, in + r], h
// [rows, F + r], and in backward dY [rows, in + r], dgate_up [rows, 2F + r], each a view of a
// buffer of grouped_ffn_row_pitch(w, r) columns. The base GEMMs then carry LoRA for r / in (or r /
// F, r / 2F) more K, and no pass re-reads an output to add an adapter term; the rank-r products xa
// = X A^T, ha = h A^T, dr = s dOut B, dB and dA stay skinny kernels, written into the padding
// columns. Gradient contract: dx is written; weight and LoRA grads accumulate (+=) and are skipped
// when undefined (a frozen base, or no adapter); the base weights' grads are written under
// weight_grads_zero.
#pragma once

#include <cstdint>
#include <optional>

#include "core/arena.h"
#include "core/context.h"
#include "core/host_device.h"
#include "core/tensor.h"
#include "ops/backends.h"
#include "ops/grouped_matmul.h"

namespace mt::ops {

// How the K-concatenation path runs a SwiGLU pass and the adapter products beside it
// (GroupedFfnParams::lora_fwd / lora_bwd, and lora_out_grads likewise; ops/cuda/lora_grouped.h):
// the SwiGLU pass, then the
// products in passes of their own (session 13); one pass staging tiles through shared memory
// (session 14); one pass whose warps form the products' MMA fragments in registers from the
// elements they computed (session 16: the forward without shared memory or barriers, the backward
// with one barrier per 32 columns where its warps' column sums meet). Gemm (lora_xa only): inside
// the base GEMM's mainloop (session 18, ops/cuda/cutlass/lora_xa_mainloop.cuh).
enum class LoraKernels { Separate, Staged, Registers, Gemm };

struct GroupedFfnParams {
  int64_t rows = 0, experts = 0, in = 0, ffn = 0;
  int64_t lora_rank = 0;  // 0: no adapter
  float lora_alpha = 0;
  // The K-concatenation path only: x (forward) and dy (backward) are the first `in` columns of
  // buffers of grouped_ffn_row_pitch(in, lora_rank) columns whose lora_rank columns after `in` the
  // op may overwrite (the MoE layer allocates its rows so; a dy whose rows are not so is copied).
  // Otherwise the op copies them into padded scratch. x's columns then carry X A^T from forward to
  // its backward (which reads it there; saved.xa is left unwritten), so the caller keeps them
  // untouched in between.
  bool padded_rows = false;
  // The caller knows the base weights' gradient buffers hold zeros (the first backward since the
  // gradients were zeroed): their weight-gradient GEMMs then write dW (beta 0) instead of adding
  // into it and skip reading the f32 buffers (the same values as adding into zeros; empty experts'
  // blocks are written as zeros). A hint: it changes traffic, not results.
  bool weight_grads_zero = false;
  // Without an adapter: forward keeps h = swiglu(gate_up) in saved.h (grouped_ffn_plan and
  // grouped_ffn_alloc_saved lay it out) for the down projection's weight gradient, so SwiGLU's
  // backward writes no h (rows x F elements less there, as many more kept from forward to
  // backward). For a trained base: a frozen one reads no h.
  bool keep_h = false;
  std::optional<GroupedGemmConfig> gemm;  // the projections' (grouped_matmul.h); unset: the env's
  // The K-concatenation path's session-13 kernels, kept so that one device run compares them with
  // their replacements (bench moe's lora_s13_* fields): the adapters packed by one copy or scale
  // per tensor (six launches) instead of grouped_ffn_lora_pack's one (dr / dB over 128-row blocks
  // both, since session 17), and SwiGLU's backward, the products over dgate_up and dA_down's
  // over h as three passes instead of grouped_ffn_lora_swiglu_backward_grads's one, SwiGLU's
  // forward and ha = h A_down^T as two instead of grouped_ffn_lora_swiglu_ha's one
  // (ops/cuda/lora_grouped.h). Same results up to the summation order of the adapters' grads.
  bool lora_s13_kernels = false;
  // The K-concatenation path's SwiGLU forward and backward with the adapter products that read
  // their operands (ha = h A_down^T; dr_gu, dB_gu, dA_down), each selectable so that one device run
  // compares them (bench moe's lora_<variant>_* fields); lora_s13_kernels runs Separate for both.
  // The defaults are session 16's mid-session measurements' fastest at shape A (LoRA fwd+bwd: fwd
  // Registers 7.02 ms, Separate 7.14, Staged 7.22; bwd Separate 6.84, Registers 7.02, Staged 7.39;
  // B alike), before the register backward prefetched its next chunk.
  LoraKernels lora_fwd = LoraKernels::Registers;
  LoraKernels lora_bwd = LoraKernels::Separate;
  // The adapter's products over an output gradient (grouped_ffn_lora_out_grads: dr = s dOut B, dB;
  // on the K-concatenation path the one over dY, and the one over dgate_up where lora_bwd is
  // Separate): Separate = two grouped products, Staged = the
  // one-pass out_grads kernel (session 14), Registers = dr's fragments in registers and dB from a
  // shared tile (session 16). lora_s13_kernels runs the one-pass kernel. Staged measured fastest
  // (shape A, ncu: 286 us, Registers 330 before its prefetch, the two products 7.17 ms against
  // 7.02 fwd+bwd; session 17: 200 us over 128-row blocks, at the running clocks).
  LoraKernels lora_out_grads = LoraKernels::Staged;
  // The K-concatenation path's xa = X A_gu^T (grouped_ffn_lora_gate_up): Gemm = formed inside the
  // gate/up GEMM's mainloop beside the base product (rank 16, `in` a multiple of 64; otherwise as
  // Staged); Registers = the register kernel, then the GEMM; Staged = grouped_matmul (the skinny
  // down kernel, session 11), then the GEMM. Gemm saved 167 us at A, 441 at B over Staged (session
  // 19 call 1, bench/RESULTS.md).
  LoraKernels lora_xa = LoraKernels::Gemm;
  // The K-concatenation backward's dr = s dOut B and dB of a projection (grouped_ffn_lora_dx: the
  // down one's, and the gate/up one's where lora_bwd is Separate): Gemm = formed inside the dX
  // GEMM's mainloop from the dOut tiles it holds (rank 16, the projection's output width a multiple
  // of 128, dB trained; otherwise as below); anything else = lora_out_grads's pass over dOut, then
  // the GEMM.
  LoraKernels lora_dr = LoraKernels::Gemm;
  // w.gate_up's rows (and so gate_up's and dgate_up's columns) interleaved in blocks of
  // kGateUpInterleave (grouped_ffn_gate_up_block) instead of the transformers layout [g | u]: a
  // GEMM tile then holds matching g and u columns, and on the GPU the gate/up GEMM's epilogue forms
  // h itself (ops/cuda/cutlass/grouped_gemm_sm90_swiglu.h, UpInterleaved): no SwiGLU pass in
  // the base path's forward. The caller permutes the weights (grouped_ffn_interleave_gate_up), and
  // with an adapter gate_up_b's rows likewise; the adapter's SwiGLU passes then run their composite
  // forms on the GPU (the skinny SwiGLU kernels read [g | u]). F a multiple of the block.
  bool interleaved_gate_up = false;
  float lora_scale() const { return lora_rank ? lora_alpha / static_cast<float>(lora_rank) : 0.f; }
};

// The interleaved gate/up layout's block (GroupedFfnParams::interleaved_gate_up): 16, so that one
// 32-column sub-tile of a GEMM's epilogue holds 16 g columns and their 16 u columns.
constexpr int64_t kGateUpInterleave = 16;
// gate_up's layout as one number, the block: h's column c reads the gate at column
// grouped_ffn_gate_column(c, block) and the up projection `block` columns further. [g | u] is one
// block of F; the interleaved layout blocks of kGateUpInterleave.
inline int64_t grouped_ffn_gate_up_block(const GroupedFfnParams& p) {
  return p.interleaved_gate_up ? kGateUpInterleave : p.ffn;
}
MT_HD inline int64_t grouped_ffn_gate_column(int64_t c, int64_t block) {
  return c / block * 2 * block + c % block;
}
// w [E, 2F, in] in the transformers layout [g | u] into `out` (same shape) in the interleaved one
// (inverse = false), or back (inverse = true): one strided copy per block, on w's device.
void grouped_ffn_interleave_gate_up(Context& ctx, const Tensor& w, Tensor& out,
                                    bool inverse = false);

// Weights, or their gradients (same shapes; undefined members are skipped).
struct GroupedFfnWeights {
  Tensor gate_up, down;
  Tensor gate_up_a, gate_up_b, down_a, down_b;  // used only when lora_rank > 0
};

// What forward keeps for backward: the pre-activations and, with LoRA, the rank-r projections and
// h. Without LoRA SwiGLU's backward forms h again where a pass reads it (dW_down), unless
// GroupedFfnParams::keep_h kept it; with LoRA the down adapter's dA always reads it, and keeping it
// (rows x F, a third of gate_up) saves backward a pass that reads gate_up and writes h.
struct GroupedFfnSaved {
  Tensor gate_up;  // [rows, 2F]
  Tensor xa;       // [rows, r]: X A_gu^T (K-concatenated with padded rows: in x's padding instead)
  Tensor ha;       // [rows, r]: h A_down^T
  Tensor h;        // [rows, F] with LoRA or keep_h: swiglu(gate_up), as forward computed it
  // On the K-concatenation path h and ha are the two column blocks of one buffer of
  // grouped_ffn_row_pitch(F, r) columns (the down GEMM's padded input) and gate_up holds the
  // adapted pre-activations.
};

// Whether the K-concatenation path serves p on `device` with activations of type `at`: the one
// place that selects it (bf16 on the GPU, an adapter of rank <= 64 and widths that keep the padded
// rows 16-byte aligned for TMA). The op takes it when this holds and the base weights are padded
// (grouped_ffn_padded); the MoE layer and the model pad them when it holds.
bool grouped_ffn_kconcat(const GroupedFfnParams& p, Device device, DType at);
// The row pitch, in elements, of a K-concatenation buffer holding w columns and an r-column adapter
// block after them ([x | xa], [dy | dr], [h | ha], [dgate_up | dr], and the padded weights [W | s
// B] over [A | 0]): w + r rounded up to 64, so that every row starts a 128-byte line. At w + r
// (2,064 at issue 14's shapes) rows began 32 bytes apart from a line and the skinny passes over
// them ran slower (session 17, X A^T at shape A: 193 us against 162 over the same rows unpadded).
inline int64_t grouped_ffn_row_pitch(int64_t w, int64_t r) {
  return (w + r + 63) / 64 * 64;
}
// The row pitch of the op's x (forward) and dy (backward) buffers: grouped_ffn_row_pitch(in, r)
// where p.padded_rows lends their padding, else in.
inline int64_t grouped_ffn_rows_pitch(const GroupedFfnParams& p) {
  return p.padded_rows ? grouped_ffn_row_pitch(p.in, p.lora_rank) : p.in;
}
// Whether w [E, out, in] is the W block of a padded [E, out + r, in + r] buffer whose rows are
// grouped_ffn_row_pitch(in, r) apart.
bool grouped_ffn_padded(const Tensor& w, int64_t r);
// W [E, out, in] moved into a new zeroed padded buffer on its device, returned as the
// strided view of its W block (which keeps the buffer alive); w itself when it already is one. The
// caller drops w's own storage: the padded buffer replaces it, it does not sit beside it.
Tensor grouped_ffn_pad_weight(const Tensor& w, int64_t r);

void grouped_ffn_plan(const GroupedFfnParams& p, ArenaPlan& plan);
// The saved tensors in the activations' dtype `at` (the rows' dtype), as grouped_ffn_plan sizes
// them under a plan whose activation dtype is `at`; h and ha padded together where
// grouped_ffn_kconcat holds on the arena's device.
GroupedFfnSaved grouped_ffn_alloc_saved(const GroupedFfnParams& p, Arena& arena,
                                        DType at = DType::F32);

// x [rows, in], offsets i32 [E+1] (offsets[E] == rows) -> y [rows, in] (written).
void grouped_ffn_forward(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                         const Tensor& offsets, const GroupedFfnWeights& w, Tensor& y,
                         GroupedFfnSaved& saved);

void grouped_ffn_backward(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                          const Tensor& offsets, const GroupedFfnWeights& w,
                          const GroupedFfnSaved& saved, const Tensor& dy, Tensor& dx,
                          GroupedFfnWeights& grads);

// The backends' part: the SwiGLU between the two grouped projections (the projections themselves
// are grouped_matmul calls), on the fused [rows, 2F] gate_up pre-activation in blocks of `block`
// columns (grouped_ffn_gate_up_block: F for [g | u], gate = columns 0..F-1, up = F..2F-1). h =
// silu(gate) * up, written. On the GPU gate_up, h, dh and dgate_up may be row-pitched views (the
// K-concatenation path's padded buffers); the CPU takes contiguous ones.
using GroupedFfnSwigluForward = void(Context& ctx, const Tensor& gate_up, Tensor& h, int64_t block);
// dgate_up from dh, written.
using GroupedFfnSwigluBackward = void(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                      Tensor& dgate_up, int64_t block);
// The same, also writing h = silu(gate) * up for the down projection's weight gradient: where the
// base trains without LoRA nothing keeps h from forward, and forming it here reads gate_up once
// instead of in a pass of its own (on the GPU: 2F elements a row less read, one launch less).
using GroupedFfnSwigluBackwardWithH = void(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                           Tensor& dgate_up, Tensor& h, int64_t block);

// The base path's projections with SwiGLU in their GEMMs' epilogues (GroupedGemmConfig::swiglu_fwd
// and swiglu_bwd, p.gemm's or the environment's; ops/cuda/cutlass/grouped_gemm_sm90_swiglu.h).
// Each returns false having written nothing where it does not apply (not requested, not bf16, not
// a layout the kernels take; always on the CPU, which has no pass to save), and the caller runs
// grouped_matmul and the SwiGLU op above instead.
// Forward: gate_up = X W_gu^T (W_gu [E, 2F, in]) and h = swiglu(gate_up), both written. In the
// [g | u] layout (requested by swiglu_fwd) the g half is a GEMM of its own before the u half's,
// whose epilogue reads g back and writes h, which saves the SwiGLU pass (2F elements a row read and
// F written) for a second read of X; in the interleaved one (p.interleaved_gate_up, whatever
// swiglu_fwd says) one GEMM's epilogue holds both and writes h beside gate_up.
using GroupedFfnGateUpSwiglu = bool(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                                    const Tensor& offsets, const Tensor& w_gu, Tensor& gate_up,
                                    Tensor& h);
// Backward: dgate_up = SwiGLU'(gate_up) (dY W_down) (W_down [E, in, F]) and, where h is defined,
// h = swiglu(gate_up), in the down projection's input-gradient GEMM: dh is never written nor read
// ([g | u] only).
using GroupedFfnDownSwigluBackward = bool(Context& ctx, const GroupedFfnParams& p, const Tensor& dy,
                                          const Tensor& offsets, const Tensor& w_down,
                                          const Tensor& gate_up, Tensor& dgate_up, Tensor& h);

// The adapter's backward products that read a projection's output gradient dOut [rows, out]
// (B [E, out, r], the saved X A^T xa [rows, r], s = p.lora_scale()): dr = s dOut B, written, and
// when db is defined dB += s dOut^T xa. The CPU runs them as two grouped_matmul calls; the GPU
// reads dOut once where it can (ops/cuda/lora_grouped.h).
using GroupedFfnLoraOutGrads = void(Context& ctx, const GroupedFfnParams& p, const Tensor& dout,
                                    const Tensor& offsets, const Tensor& b, const Tensor& xa,
                                    Tensor& dr, Tensor& db);

// The gate/up projection's adapter term and the SwiGLU, after the base GEMM wrote gate_up
// [rows, 2F]: h = silu(g) * u, written, with [g | u] = gate_up + s xa B^T (B = gate_up_b [E, 2F,
// r], s = p.lora_scale()) in the activations' type. gate_up stays as the base GEMM wrote it:
// backward forms the sum again (grouped_ffn_lora_swiglu_backward), which costs less than storing
// it back. One pass over gate_up on the GPU (ops/cuda/lora_grouped.h).
using GroupedFfnLoraSwiglu = void(Context& ctx, const GroupedFfnParams& p, const Tensor& xa,
                                  const Tensor& offsets, const Tensor& b, const Tensor& gate_up,
                                  Tensor& h);
// Its backward, joined with the down projection's adapter input gradient: dgate_up, written, is
// SwiGLU's derivative at [g | u] = gate_up + s xa B^T (as forward rounded it) applied to dh + dr
// A_down (dh: the base GEMM's dOut W_down; dr [rows, r]: s dOut B_down; A_down [E, r, F]). One
// pass on the GPU, where the separate up product wrote dh whole before the base GEMM added into it.
using GroupedFfnLoraSwigluBackward = void(Context& ctx, const GroupedFfnParams& p,
                                          const Tensor& gate_up, const Tensor& xa,
                                          const Tensor& offsets, const Tensor& b, const Tensor& dh,
                                          const Tensor& dr, const Tensor& a_down, Tensor& dgate_up);

// The K-concatenation path's SwiGLU forward joined with the down adapter's first product: h =
// silu(g) u over gate_up = [g | u] (written, as grouped_ffn_swiglu_forward rounds it) and ha = h
// A_down^T (A_down [E, r, F]; written). One pass over gate_up on the GPU, where the down product
// read h back.
using GroupedFfnLoraSwigluHa = void(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
                                    const Tensor& offsets, const Tensor& a_down, Tensor& h,
                                    Tensor& ha);

// The K-concatenation path's SwiGLU backward joined with the adapter products that read its output
// and h (s = p.lora_scale()): dgate_up = SwiGLU'(gate_up) dh (written; gate_up holds the adapted
// pre-activations there), dr_gu = s dgate_up B_gu (written; B_gu [E, 2F, r]), dB_gu += s dgate_up^T
// xa and dA_down += dr_down^T h (h [rows, F] as forward saved it, dr_down [rows, r] = s dY B_down;
// each skipped when undefined). One pass over gate_up and dh on the GPU, where SwiGLU's backward,
// the products over dgate_up and the one over h took three (ops/cuda/lora_grouped.h).
using GroupedFfnLoraSwigluBackwardGrads = void(Context& ctx, const GroupedFfnParams& p,
                                               const Tensor& gate_up, const Tensor& dh,
                                               const Tensor& offsets, const Tensor& h,
                                               const Tensor& dr_down, const Tensor& xa,
                                               const Tensor& b_gu, Tensor& dgate_up, Tensor& dr_gu,
                                               Tensor& db_gu, Tensor& da_down);

// The gate/up adapter's first product xa = X A_gu^T (x [rows, in], A [E, r, in]; xa [rows, r],
// written), as grouped_matmul's XWt form computes it (the CPU's body and the GPU's fallback), or on
// the GPU in one pass over X with the fragments formed in registers (GroupedFfnParams::lora_xa ==
// Registers; ops/cuda/lora_grouped.h).
using GroupedFfnLoraXa = void(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                              const Tensor& offsets, const Tensor& a, Tensor& xa);

// The K-concatenation forward's gate/up projection: gate_up = [X | xa] W_gu' ^T with xa = X A_gu^T
// written into xp's columns in .. in + r - 1 (xp [rows, in + r], X its first `in` columns; w_gu
// [E, 2F, in + r] the gate/up block of the padded buffer, whose columns in .. hold s B_gu; a_gu
// [E, r, in]). grouped_ffn_lora_xa then the grouped GEMM, or on the GPU (GroupedFfnParams::lora_xa
// == Gemm) one GEMM that forms xa in its mainloop (ops/cuda/grouped_matmul.h). Where h is defined
// (the interleaved layout, GroupedFfnParams::interleaved_gate_up) that GEMM may also write h =
// swiglu(gate_up) and return true; false: h is left to the caller's SwiGLU pass.
using GroupedFfnLoraGateUp = bool(Context& ctx, const GroupedFfnParams& p, const Tensor& xp,
                                  const Tensor& offsets, const Tensor& a_gu, const Tensor& w_gu,
                                  Tensor& gate_up, Tensor& h);

// A K-concatenated projection's backward (the down projection's, and the gate/up one's where
// lora_bwd is Separate): dr = s dOut B written into dyp's columns w .. w + r - 1 (dyp [rows, w +
// r], dOut its first w columns), dB += s dOut^T R where db is defined (R = ha or xa [rows, r]), and
// dX = [dOut | dr] w_dx (w_dx [E, w + r, in], the padded buffer's input-gradient view, whose
// columns in .. in + r - 1 hold s B and rows w .. A). grouped_ffn_lora_out_grads then the grouped
// GEMM, or on the GPU (GroupedFfnParams::lora_dr == Gemm) one GEMM that forms dr and dB in its
// mainloop (ops/cuda/grouped_matmul.h).
using GroupedFfnLoraDx = void(Context& ctx, const GroupedFfnParams& p, const Tensor& dyp,
                              const Tensor& offsets, const Tensor& b, const Tensor& r_rows,
                              const Tensor& w_dx, Tensor& db, Tensor& dx);

// The K-concatenation path's adapter packing, both projections: [[W, s B], [A, 0]] in each padded
// buffer, i.e. A [E, r, in] into its rows out .. out + r - 1 (columns 0 .. in - 1) and s B
// [E, out, r] (s = p.lora_scale(), rounded once into the buffer's type) into its columns in .. in +
// r - 1 (rows 0 .. out - 1), for w.gate_up (gate_up_a, gate_up_b) and w.down (down_a, down_b),
// the W blocks of their padded buffers (grouped_ffn_padded). The factors may be f32 or the
// buffer's type. One launch on the GPU (the copies it replaces moved E r (out + in) elements per
// tensor through an index kernel at a tenth of HBM's speed).
using GroupedFfnLoraPack = void(Context& ctx, const GroupedFfnParams& p,
                                const GroupedFfnWeights& w);

// Called by the entries above once they validated: ops/cpu/grouped_ffn.cpp, and
// ops/cuda/grouped_ffn.cu in CUDA builds.
MT_OP_BACKENDS(GroupedFfnSwigluForward grouped_ffn_swiglu_forward;
               GroupedFfnSwigluBackward grouped_ffn_swiglu_backward;
               GroupedFfnSwigluBackwardWithH grouped_ffn_swiglu_backward_with_h;
               GroupedFfnGateUpSwiglu grouped_ffn_gate_up_swiglu;
               GroupedFfnDownSwigluBackward grouped_ffn_down_swiglu_backward;
               GroupedFfnLoraOutGrads grouped_ffn_lora_out_grads;
               GroupedFfnLoraSwiglu grouped_ffn_lora_swiglu;
               GroupedFfnLoraSwigluBackward grouped_ffn_lora_swiglu_backward;
               GroupedFfnLoraPack grouped_ffn_lora_pack;
               GroupedFfnLoraSwigluBackwardGrads grouped_ffn_lora_swiglu_backward_grads;
               GroupedFfnLoraSwigluHa grouped_ffn_lora_swiglu_ha;
               GroupedFfnLoraXa grouped_ffn_lora_xa; GroupedFfnLoraGateUp grouped_ffn_lora_gate_up;
               GroupedFfnLoraDx grouped_ffn_lora_dx;)

}  // namespace mt::ops
