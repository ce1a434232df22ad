#include "ops/grouped_ffn.h"

#include "ops/activation.h"
#include "ops/gemm.h"

namespace mt::ops {

namespace {

bool has(const Tensor& t) {
  return t.defined() && t.numel() > 0;
}

void check(const GroupedFfnParams& p, const Tensor& x, const Tensor& offsets,
           const GroupedFfnWeights& w) {
  const int64_t E = p.experts, l = p.in, F = p.ffn, r = p.lora_rank;
  MT_CHECK(E > 0 && l > 0 && F > 0 && r >= 0, ValueError, "grouped_ffn: experts ", E, ", in ", l,
           ", ffn ", F, ", rank ", r);
  expect_shape(x, {p.rows, l}, "grouped_ffn x");
  expect_shape(offsets, {E + 1}, "grouped_ffn offsets");
  expect_shape(w.gate_up, {E, 2 * F, l}, "experts.gate_up_proj");
  expect_shape(w.down, {E, l, F}, "experts.down_proj");
  if (r > 0) {
    expect_shape(w.gate_up_a, {E, r, l}, "experts.gate_up_lora_A");
    expect_shape(w.gate_up_b, {E, 2 * F, r}, "experts.gate_up_lora_B");
    expect_shape(w.down_a, {E, r, F}, "experts.down_lora_A");
    expect_shape(w.down_b, {E, l, r}, "experts.down_lora_B");
  }
  const int32_t* off = offsets.i32();
  MT_CHECK(off[0] == 0 && off[E] == p.rows, ValueError, "grouped_ffn: offsets span [", off[0], ", ",
           off[E], "), expected [0, ", p.rows, ")");
  for (int64_t e = 0; e < E; ++e)
    MT_CHECK(off[e] <= off[e + 1], ValueError, "grouped_ffn: offsets decrease at expert ", e);
}

// h = silu(gate) * up over all rows of the fused [rows, 2F] pre-activation.
void swiglu_rows(Context& ctx, const float* gu, int64_t rows, int64_t F, float* h) {
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* g = gu + i * 2 * F;
    const float* u = g + F;
    float* o = h + i * F;
    for (int64_t c = 0; c < F; ++c) o[c] = g[c] * sigmoidf(g[c]) * u[c];
  }
}

}  // namespace

void grouped_ffn_plan(const GroupedFfnParams& p, ArenaPlan& plan) {
  plan.add({p.rows, 2 * p.ffn});
  if (p.lora_rank > 0) {
    plan.add({p.rows, p.lora_rank});
    plan.add({p.rows, p.lora_rank});
  }
}

GroupedFfnSaved grouped_ffn_alloc_saved(const GroupedFfnParams& p, Arena& arena) {
  GroupedFfnSaved s;
  s.gate_up = arena.alloc({p.rows, 2 * p.ffn});
  if (p.lora_rank > 0) {
    s.xa = arena.alloc({p.rows, p.lora_rank});
    s.ha = arena.alloc({p.rows, p.lora_rank});
  }
  return s;
}

void grouped_ffn_forward(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                         const Tensor& offsets, const GroupedFfnWeights& w, Tensor& y,
                         GroupedFfnSaved& saved) {
  check(p, x, offsets, w);
  const int64_t E = p.experts, l = p.in, F = p.ffn, r = p.lora_rank, N = p.rows;
  expect_shape(y, {N, l}, "grouped_ffn y");
  expect_shape(saved.gate_up, {N, 2 * F}, "grouped_ffn saved gate_up");
  if (r > 0) {
    expect_shape(saved.xa, {N, r}, "grouped_ffn saved xa");
    expect_shape(saved.ha, {N, r}, "grouped_ffn saved ha");
  }
  const float s = p.lora_scale();
  const int32_t* off = offsets.i32();
  const float* px = x.f32();
  float* pgu = saved.gate_up.f32();
  float* pxa = r > 0 ? saved.xa.f32() : nullptr;
  float* pha = r > 0 ? saved.ha.f32() : nullptr;
  float* py = y.f32();

  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    const float* X = px + r0 * l;
    float* GU = pgu + r0 * 2 * F;
    gemm(ctx, false, true, n, 2 * F, l, 1.f, X, l, w.gate_up.f32() + e * 2 * F * l, l, 0.f, GU,
         2 * F);
    if (r > 0) {
      float* XA = pxa + r0 * r;
      gemm(ctx, false, true, n, r, l, 1.f, X, l, w.gate_up_a.f32() + e * r * l, l, 0.f, XA, r);
      gemm(ctx, false, true, n, 2 * F, r, s, XA, r, w.gate_up_b.f32() + e * 2 * F * r, r, 1.f, GU,
           2 * F);
    }
  }

  ArenaScope scope(ctx.workspace());
  Tensor h_t = ctx.workspace().alloc({N, F});
  float* ph = h_t.f32();
  swiglu_rows(ctx, pgu, N, F, ph);

  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    const float* H = ph + r0 * F;
    float* Y = py + r0 * l;
    gemm(ctx, false, true, n, l, F, 1.f, H, F, w.down.f32() + e * l * F, F, 0.f, Y, l);
    if (r > 0) {
      float* HA = pha + r0 * r;
      gemm(ctx, false, true, n, r, F, 1.f, H, F, w.down_a.f32() + e * r * F, F, 0.f, HA, r);
      gemm(ctx, false, true, n, l, r, s, HA, r, w.down_b.f32() + e * l * r, r, 1.f, Y, l);
    }
  }
}

void grouped_ffn_backward(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                          const Tensor& offsets, const GroupedFfnWeights& w,
                          const GroupedFfnSaved& saved, const Tensor& dy, Tensor& dx,
                          GroupedFfnWeights& grads) {
  check(p, x, offsets, w);
  const int64_t E = p.experts, l = p.in, F = p.ffn, r = p.lora_rank, N = p.rows;
  expect_shape(dy, {N, l}, "grouped_ffn dy");
  expect_shape(dx, {N, l}, "grouped_ffn dx");
  expect_shape(saved.gate_up, {N, 2 * F}, "grouped_ffn saved gate_up");
  const bool g_gu = has(grads.gate_up), g_dn = has(grads.down);
  const bool g_gua = r > 0 && has(grads.gate_up_a), g_gub = r > 0 && has(grads.gate_up_b);
  const bool g_dna = r > 0 && has(grads.down_a), g_dnb = r > 0 && has(grads.down_b);
  if (g_gu) expect_shape(grads.gate_up, w.gate_up.shape(), "grad experts.gate_up_proj");
  if (g_dn) expect_shape(grads.down, w.down.shape(), "grad experts.down_proj");
  if (g_gua) expect_shape(grads.gate_up_a, w.gate_up_a.shape(), "grad experts.gate_up_lora_A");
  if (g_gub) expect_shape(grads.gate_up_b, w.gate_up_b.shape(), "grad experts.gate_up_lora_B");
  if (g_dna) expect_shape(grads.down_a, w.down_a.shape(), "grad experts.down_lora_A");
  if (g_dnb) expect_shape(grads.down_b, w.down_b.shape(), "grad experts.down_lora_B");
  const float s = p.lora_scale();
  const int32_t* off = offsets.i32();
  const float* px = x.f32();
  const float* pgu = saved.gate_up.f32();
  const float* pxa = r > 0 ? saved.xa.f32() : nullptr;
  const float* pha = r > 0 ? saved.ha.f32() : nullptr;
  const float* pdy = dy.f32();
  float* pdx = dx.f32();

  ArenaScope scope(ctx.workspace());
  Tensor h_t = ctx.workspace().alloc({N, F});
  Tensor dh_t = ctx.workspace().alloc({N, F});
  Tensor dgu_t = ctx.workspace().alloc({N, 2 * F});
  Tensor dr_t = ctx.workspace().alloc({N, r});
  float* ph = h_t.f32();
  float* pdh = dh_t.f32();
  float* pdgu = dgu_t.f32();
  float* pdr = dr_t.f32();
  swiglu_rows(ctx, pgu, N, F, ph);

  // Down projection: dH = dY Wd (+ LoRA path), grads of Wd and its adapter.
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    const float* H = ph + r0 * F;
    const float* dY = pdy + r0 * l;
    float* dH = pdh + r0 * F;
    gemm(ctx, false, false, n, F, l, 1.f, dY, l, w.down.f32() + e * l * F, F, 0.f, dH, F);
    if (g_dn)
      gemm(ctx, true, false, l, F, n, 1.f, dY, l, H, F, 1.f, grads.down.f32() + e * l * F, F);
    if (r > 0) {
      float* dHA = pdr + r0 * r;
      gemm(ctx, false, false, n, r, l, s, dY, l, w.down_b.f32() + e * l * r, r, 0.f, dHA, r);
      gemm(ctx, false, false, n, F, r, 1.f, dHA, r, w.down_a.f32() + e * r * F, F, 1.f, dH, F);
      if (g_dnb)
        gemm(ctx, true, false, l, r, n, s, dY, l, pha + r0 * r, r, 1.f,
             grads.down_b.f32() + e * l * r, r);
      if (g_dna)
        gemm(ctx, true, false, r, F, n, 1.f, dHA, r, H, F, 1.f, grads.down_a.f32() + e * r * F, F);
    }
  }

#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = pgu + i * 2 * F;
    const float* u = g + F;
    const float* d = pdh + i * F;
    float* dg = pdgu + i * 2 * F;
    float* du = dg + F;
    for (int64_t c = 0; c < F; ++c) {
      const float sg = sigmoidf(g[c]);
      du[c] = d[c] * g[c] * sg;
      dg[c] = d[c] * u[c] * sg * (1.0f + g[c] * (1.0f - sg));
    }
  }

  // Gate/up projection: dX = dGU Wgu (+ LoRA path), grads of Wgu and its adapter.
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    const float* X = px + r0 * l;
    const float* dGU = pdgu + r0 * 2 * F;
    float* dX = pdx + r0 * l;
    gemm(ctx, false, false, n, l, 2 * F, 1.f, dGU, 2 * F, w.gate_up.f32() + e * 2 * F * l, l, 0.f,
         dX, l);
    if (g_gu)
      gemm(ctx, true, false, 2 * F, l, n, 1.f, dGU, 2 * F, X, l, 1.f,
           grads.gate_up.f32() + e * 2 * F * l, l);
    if (r > 0) {
      float* dXA = pdr + r0 * r;
      gemm(ctx, false, false, n, r, 2 * F, s, dGU, 2 * F, w.gate_up_b.f32() + e * 2 * F * r, r, 0.f,
           dXA, r);
      gemm(ctx, false, false, n, l, r, 1.f, dXA, r, w.gate_up_a.f32() + e * r * l, l, 1.f, dX, l);
      if (g_gub)
        gemm(ctx, true, false, 2 * F, r, n, s, dGU, 2 * F, pxa + r0 * r, r, 1.f,
             grads.gate_up_b.f32() + e * 2 * F * r, r);
      if (g_gua)
        gemm(ctx, true, false, r, l, n, 1.f, dXA, r, X, l, 1.f, grads.gate_up_a.f32() + e * r * l,
             l);
    }
  }
}

}  // namespace mt::ops
