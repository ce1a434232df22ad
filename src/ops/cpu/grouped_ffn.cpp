#include "ops/grouped_ffn.h"

#include "ops/activation.h"
#include "ops/grouped_ffn_lora.h"
#include "ops/grouped_matmul.h"

namespace mt::ops::cpu {

void grouped_ffn_swiglu_forward(Context& ctx, const Tensor& gate_up, Tensor& h, int64_t block) {
  const int64_t rows = h.dim(0), F = h.dim(1);
  const float* gu = gate_up.f32();
  float* ph = h.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = gu + i * 2 * F;
    float* o = ph + i * F;
    for (int64_t c = 0; c < F; ++c) {
      const float* g = row + grouped_ffn_gate_column(c, block);
      o[c] = g[0] * sigmoidf(g[0]) * g[block];
    }
  }
}

void grouped_ffn_swiglu_backward(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                 Tensor& dgate_up, int64_t block) {
  const int64_t N = dh.dim(0), F = dh.dim(1);
  const float* pgu = gate_up.f32();
  const float* pdh = dh.f32();
  float* pdgu = dgate_up.f32();
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* d = pdh + i * F;
    for (int64_t c = 0; c < F; ++c) {
      const int64_t at = i * 2 * F + grouped_ffn_gate_column(c, block);
      const float g = pgu[at], u = pgu[at + block], sg = sigmoidf(g);
      pdgu[at + block] = d[c] * g * sg;
      pdgu[at] = d[c] * u * sg * (1.0f + g * (1.0f - sg));
    }
  }
}

// Two passes: the CPU has no traffic to save.
void grouped_ffn_swiglu_backward_with_h(Context& ctx, const Tensor& gate_up, const Tensor& dh,
                                        Tensor& dgate_up, Tensor& h, int64_t block) {
  grouped_ffn_swiglu_backward(ctx, gate_up, dh, dgate_up, block);
  grouped_ffn_swiglu_forward(ctx, gate_up, h, block);
}

// The CPU has no SwiGLU pass to save: the caller runs the separate ops.
bool grouped_ffn_gate_up_swiglu(Context&, const GroupedFfnParams&, const Tensor&, const Tensor&,
                                const Tensor&, Tensor&, Tensor&) {
  return false;
}

bool grouped_ffn_down_swiglu_backward(Context&, const GroupedFfnParams&, const Tensor&,
                                      const Tensor&, const Tensor&, const Tensor&, Tensor&,
                                      Tensor&) {
  return false;
}

// Two grouped_matmul calls (which dispatch on the tensors' device: the GPU's body falls back to
// this one when its fused kernel declines).
void grouped_ffn_lora_out_grads(Context& ctx, const GroupedFfnParams& p, const Tensor& dout,
                                const Tensor& offsets, const Tensor& b, const Tensor& xa,
                                Tensor& dr, Tensor& db) {
  const float s = p.lora_scale();
  ops::grouped_matmul(ctx, {.form = GroupedForm::DyW, .alpha = s, .gemm = p.gemm}, dout, offsets, b,
                      dr);
  if (db.defined() && db.numel() > 0)
    ops::grouped_matmul(ctx, {.form = GroupedForm::DytX, .alpha = s, .beta = 1.f, .gemm = p.gemm},
                        dout, offsets, xa, db);
}

void grouped_ffn_lora_swiglu(Context& ctx, const GroupedFfnParams& p, const Tensor& xa,
                             const Tensor& offsets, const Tensor& b, const Tensor& gate_up,
                             Tensor& h) {
  lora_composite::swiglu(ctx, p, xa, offsets, b, gate_up, h, grouped_ffn_swiglu_forward);
}

void grouped_ffn_lora_swiglu_backward(Context& ctx, const GroupedFfnParams& p,
                                      const Tensor& gate_up, const Tensor& xa,
                                      const Tensor& offsets, const Tensor& b, const Tensor& dh,
                                      const Tensor& dr, const Tensor& a_down, Tensor& dgate_up) {
  lora_composite::swiglu_backward(ctx, p, gate_up, xa, offsets, b, dh, dr, a_down, dgate_up,
                                  grouped_ffn_swiglu_backward);
}

void grouped_ffn_lora_pack(Context& ctx, const GroupedFfnParams& p, const GroupedFfnWeights& w) {
  lora_composite::pack(ctx, p, w);
}

void grouped_ffn_lora_swiglu_backward_grads(Context& ctx, const GroupedFfnParams& p,
                                            const Tensor& gate_up, const Tensor& dh,
                                            const Tensor& offsets, const Tensor& h,
                                            const Tensor& dr_down, const Tensor& xa,
                                            const Tensor& b_gu, Tensor& dgate_up, Tensor& dr_gu,
                                            Tensor& db_gu, Tensor& da_down) {
  lora_composite::swiglu_backward_grads(ctx, p, gate_up, dh, offsets, h, dr_down, xa, b_gu,
                                        dgate_up, dr_gu, db_gu, da_down,
                                        grouped_ffn_swiglu_backward, grouped_ffn_lora_out_grads);
}

void grouped_ffn_lora_swiglu_ha(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
                                const Tensor& offsets, const Tensor& a_down, Tensor& h,
                                Tensor& ha) {
  lora_composite::swiglu_ha(ctx, p, gate_up, offsets, a_down, h, ha, grouped_ffn_swiglu_forward);
}

void grouped_ffn_lora_xa(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                         const Tensor& offsets, const Tensor& a, Tensor& xa) {
  ops::grouped_matmul(ctx, {.form = GroupedForm::XWt, .gemm = p.gemm}, x, offsets, a, xa);
}

// h is left to the caller (the CPU has no pass to save).
bool grouped_ffn_lora_gate_up(Context& ctx, const GroupedFfnParams& p, const Tensor& xp,
                              const Tensor& offsets, const Tensor& a_gu, const Tensor& w_gu,
                              Tensor& gate_up, Tensor&) {
  lora_composite::gate_up(ctx, p, xp, offsets, a_gu, w_gu, gate_up, grouped_ffn_lora_xa);
  return false;
}

void grouped_ffn_lora_dx(Context& ctx, const GroupedFfnParams& p, const Tensor& dyp,
                         const Tensor& offsets, const Tensor& b, const Tensor& r_rows,
                         const Tensor& w_dx, Tensor& db, Tensor& dx) {
  lora_composite::dx(ctx, p, dyp, offsets, b, r_rows, w_dx, db, dx, grouped_ffn_lora_out_grads);
}

}  // namespace mt::ops::cpu
