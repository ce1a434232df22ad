#include "ops/grouped_ffn.h"
#include "ops/grouped_ffn_lora.h"

#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/grouped_matmul.h"

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
  expect_dims(x, {p.rows, l}, "grouped_ffn x");
  // The base weights may be blocks of their K-concatenation buffers (grouped_ffn_pad_weight).
  expect_dims(w.gate_up, {E, 2 * F, l}, "experts.gate_up_proj");
  expect_dims(w.down, {E, l, F}, "experts.down_proj");
  if (r > 0) {
    expect_shape(w.gate_up_a, {E, r, l}, "experts.gate_up_lora_A");
    expect_shape(w.gate_up_b, {E, 2 * F, r}, "experts.gate_up_lora_B");
    expect_shape(w.down_a, {E, r, F}, "experts.down_lora_A");
    expect_shape(w.down_b, {E, l, r}, "experts.down_lora_B");
  }
  MT_CHECK(!p.interleaved_gate_up || F % kGateUpInterleave == 0, ValueError,
           "grouped_ffn: the interleaved gate/up layout needs an FFN width that is a multiple of ",
           kGateUpInterleave, " (", F, ")");
  expect_group_offsets(offsets, E, p.rows, "grouped_ffn offsets");
}

// The down projection's forward configuration (GroupedGemmConfig::down).
GroupedGemmConfig down_gemm(const GroupedFfnParams& p) {
  return (p.gemm ? *p.gemm : grouped_gemm_config_from_env()).down(p.rows, p.experts);
}

// Whether forward keeps h = swiglu(gate_up) in saved.h: with an adapter (its dA reads h), or on
// request (GroupedFfnParams::keep_h).
bool saves_h(const GroupedFfnParams& p) {
  return p.lora_rank > 0 || p.keep_h;
}

// The projections' forms, with the op's GEMM configuration.
// dw adds into a gradient; dw_base is the base weights', which writes where the caller says they
// hold zeros (GroupedFfnParams::weight_grads_zero). fwd_down is the down projection's base GEMM.
struct Forms {
  GroupedMatmulParams fwd, fwd_down, dx, dw, dw_base;
  explicit Forms(const GroupedFfnParams& p)
      : fwd{.form = GroupedForm::XWt, .gemm = p.gemm},
        fwd_down{.form = GroupedForm::XWt, .gemm = down_gemm(p)},
        dx{.form = GroupedForm::DyW, .gemm = p.gemm},
        dw{.form = GroupedForm::DytX, .beta = 1.f, .gemm = p.gemm},
        dw_base{
            .form = GroupedForm::DytX, .beta = p.weight_grads_zero ? 0.f : 1.f, .gemm = p.gemm} {}
};

GroupedMatmulParams scaled(GroupedMatmulParams p, float alpha, float beta) {
  p.alpha = alpha;
  p.beta = beta;
  return p;
}

// out = base(beta) + LoRA. On the GPU the LoRA term is written first and the base GEMM adds into
// it (beta = 1): the base GEMM is compute-bound, so reading C in its epilogue is nearly free,
// whereas the rank-r product adding into C afterwards is a read and a write of the whole output.
// The CPU keeps the base first (its results, and the bf16 emulation that mirrors them in
// tests/cuda/test_cuda_grouped.cpp, are unchanged).
// (Templates, not std::function: a step allocates nothing.)
template <typename Base, typename Lora>
void with_lora(const Tensor& x, const Base& base, const Lora& lora) {
  if (x.device() == Device::CUDA) {
    lora(0.f);
    base(1.f);
  } else {
    base(0.f);
    lora(1.f);
  }
}

// The SwiGLU between the projections runs where the tensors are (the projections dispatch
// themselves through grouped_matmul).
void swiglu_forward(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up, Tensor& h) {
  dispatch(MT_NAMED_OP_BODIES("grouped_ffn_forward", grouped_ffn_swiglu_forward), {&gate_up, &h},
           ctx, gate_up, h, grouped_ffn_gate_up_block(p));
}

void swiglu_backward(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
                     const Tensor& dh, Tensor& dgate_up) {
  dispatch(MT_NAMED_OP_BODIES("grouped_ffn_backward", grouped_ffn_swiglu_backward),
           {&gate_up, &dh, &dgate_up}, ctx, gate_up, dh, dgate_up, grouped_ffn_gate_up_block(p));
}

void swiglu_backward_with_h(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
                            const Tensor& dh, Tensor& dgate_up, Tensor& h) {
  dispatch(MT_NAMED_OP_BODIES("grouped_ffn_backward", grouped_ffn_swiglu_backward_with_h),
           {&gate_up, &dh, &dgate_up, &h}, ctx, gate_up, dh, dgate_up, h,
           grouped_ffn_gate_up_block(p));
}

// The fused projections (grouped_ffn.h): false where the caller runs the separate passes.
bool gate_up_swiglu(Context& ctx, const GroupedFfnParams& p, const Tensor& x, const Tensor& offsets,
                    const Tensor& w_gu, Tensor& gate_up, Tensor& h) {
  return dispatch(MT_NAMED_OP_BODIES("grouped_ffn_forward", grouped_ffn_gate_up_swiglu),
                  {&x, &w_gu, &gate_up, &h}, ctx, p, x, offsets, w_gu, gate_up, h);
}

bool down_swiglu_backward(Context& ctx, const GroupedFfnParams& p, const Tensor& dy,
                          const Tensor& offsets, const Tensor& w_down, const Tensor& gate_up,
                          Tensor& dgate_up, Tensor& h) {
  return dispatch(MT_NAMED_OP_BODIES("grouped_ffn_backward", grouped_ffn_down_swiglu_backward),
                  {&dy, &w_down, &gate_up, &dgate_up, &h}, ctx, p, dy, offsets, w_down, gate_up,
                  dgate_up, h);
}

void lora_swiglu(Context& ctx, const GroupedFfnParams& p, const Tensor& xa, const Tensor& offsets,
                 const Tensor& b, const Tensor& gate_up, Tensor& h) {
  dispatch(MT_NAMED_OP_BODIES("grouped_ffn_forward", grouped_ffn_lora_swiglu),
           {&xa, &b, &gate_up, &h}, ctx, p, xa, offsets, b, gate_up, h);
}

void lora_swiglu_backward(Context& ctx, const GroupedFfnParams& p, const Tensor& gate_up,
                          const Tensor& xa, const Tensor& offsets, const Tensor& b,
                          const Tensor& dh, const Tensor& dr, const Tensor& a_down,
                          Tensor& dgate_up) {
  dispatch(MT_NAMED_OP_BODIES("grouped_ffn_backward", grouped_ffn_lora_swiglu_backward),
           {&gate_up, &xa, &b, &dh, &dr, &a_down, &dgate_up}, ctx, p, gate_up, xa, offsets, b, dh,
           dr, a_down, dgate_up);
}

void lora_out_grads(Context& ctx, const GroupedFfnParams& p, const Tensor& dout,
                    const Tensor& offsets, const Tensor& b, const Tensor& xa, Tensor& dr,
                    Tensor& db) {
  dispatch(MT_NAMED_OP_BODIES("grouped_ffn_backward", grouped_ffn_lora_out_grads),
           {&dout, &b, &xa, &dr, &db}, ctx, p, dout, offsets, b, xa, dr, db);
}

// The K-concatenation path (grouped_ffn.h). The padded [E, out + r, in + r] buffer around a
// padded weight's block, and the [rows, w + r] buffer around a padded activation's first w
// columns: non-owning views for the call (the weight's view, the caller's rows keep them alive).
using lora_composite::padded_weight;

Tensor padded_rows(const Tensor& t, int64_t r) {
  return Tensor(t.raw(), {t.dim(0), t.stride(0)}, t.dtype(), t.device()).cols(0, t.dim(1) + r);
}

// A [rows, w + r] view of a fresh scratch buffer at grouped_ffn_row_pitch(w, r).
Tensor padded_scratch(Context& ctx, int64_t rows, int64_t w, int64_t r, DType at) {
  return ctx.workspace().alloc({rows, grouped_ffn_row_pitch(w, r)}, at).cols(0, w + r);
}

// Whether this call runs K-concatenated: the path applies, the base weights sit in their padded
// buffers, and the saved h has ha beside it (grouped_ffn_alloc_saved laid them out so).
bool kconcat_call(const GroupedFfnParams& p, const Tensor& x, const GroupedFfnWeights& w,
                  const GroupedFfnSaved& saved) {
  const int64_t r = p.lora_rank, F = p.ffn;
  return grouped_ffn_kconcat(p, x.device(), x.dtype()) && grouped_ffn_padded(w.gate_up, r) &&
         grouped_ffn_padded(w.down, r) && saved.h.defined() &&
         saved.h.stride(0) == grouped_ffn_row_pitch(F, r) && saved.ha.defined() &&
         saved.ha.raw() == static_cast<char*>(saved.h.raw()) + F * dtype_size(saved.h.dtype()) &&
         (!p.padded_rows || x.stride(0) == grouped_ffn_rows_pitch(p));
}

// Whether X A^T stays in x's padding from forward to backward, which then reads it there instead of
// a copy in saved.xa: the caller lends the padding for the pair of calls (GroupedFfnParams::
// padded_rows). Session 13's kernels copied it (saving a launch of N r elements each way).
bool kconcat_xa_in_rows(const GroupedFfnParams& p) {
  return p.padded_rows && !p.lora_s13_kernels;
}

// The SwiGLU passes' kernels (GroupedFfnParams::lora_fwd / lora_bwd; session 13's under
// lora_s13_kernels).
LoraKernels lora_fwd(const GroupedFfnParams& p) {
  return p.lora_s13_kernels ? LoraKernels::Separate : p.lora_fwd;
}
LoraKernels lora_bwd(const GroupedFfnParams& p) {
  return p.lora_s13_kernels ? LoraKernels::Separate : p.lora_bwd;
}

// X A^T where a K-concatenated forward left it, for its backward: x's padding or saved.xa.
Tensor kconcat_xa(const GroupedFfnParams& p, const Tensor& x, const GroupedFfnSaved& saved) {
  const int64_t l = p.in, r = p.lora_rank;
  return kconcat_xa_in_rows(p) ? padded_rows(x, r).cols(l, l + r) : saved.xa;
}

// The adapters into the pads of the base weights' buffers (grouped_ffn_lora_pack). Every forward
// does it: the optimizer updates A and B in place between steps, and one pass over them (E r (out +
// in) elements per projection) costs less than tracking that.
void pack_adapters(Context& ctx, const GroupedFfnParams& p, const GroupedFfnWeights& w) {
  if (p.lora_s13_kernels) return lora_composite::pack(ctx, p, w);
  dispatch(MT_NAMED_OP_BODIES("grouped_ffn_forward", grouped_ffn_lora_pack),
           {&w.gate_up, &w.down, &w.gate_up_a, &w.gate_up_b, &w.down_a, &w.down_b}, ctx, p, w);
}

// Traffic per pass, in elements (N rows, d = in; each GEMM reads its padded input and writes its
// output once): xa = X A^T reads X (N d) into X's padding, the gate/up GEMM reads [X | xa] and
// writes the adapted gate_up (2 N F), SwiGLU reads it and writes h (3 N F) and, in the same pass
// on the GPU, ha = h A_down^T into h's padding (grouped_ffn_lora_swiglu_ha; session 13 read h
// back for it, N F), the down GEMM reads [h | ha] and writes y (N d). Against the separate passes
// this saves the up product's write of y and the base GEMM's read of it back (2 N d), and SwiGLU
// needs no adapter term (no rank-r MMAs in a memory-bound pass).
void forward_kconcat(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                     const Tensor& offsets, const GroupedFfnWeights& w, Tensor& y,
                     GroupedFfnSaved& saved) {
  const int64_t l = p.in, F = p.ffn, r = p.lora_rank, N = p.rows;
  const Forms form(p);
  pack_adapters(ctx, p, w);
  ArenaScope scope(ctx.workspace());
  Tensor xp;
  if (p.padded_rows) {
    xp = padded_rows(x, r);
  } else {  // one copy of X: the caller's rows have no padding to lend
    xp = padded_scratch(ctx, N, l, r, x.dtype());
    Tensor head = xp.cols(0, l);
    ops::copy(ctx, x, head);
  }
  const Tensor w_gu = padded_weight(w.gate_up, r).narrow(1, 0, 2 * F);
  // The interleaved layout's GEMM may write h as well (then ha is one skinny product over it).
  Tensor h_req = p.interleaved_gate_up ? saved.h : Tensor();
  const bool h_done = dispatch(MT_NAMED_OP_BODIES("grouped_ffn_forward", grouped_ffn_lora_gate_up),
                               {&xp, &w.gate_up_a, &w_gu, &saved.gate_up}, ctx, p, xp, offsets,
                               w.gate_up_a, w_gu, saved.gate_up, h_req);
  // For dB in backward (N r elements): the caller's padded rows keep it (kconcat_xa_in_rows).
  if (!kconcat_xa_in_rows(p)) ops::copy(ctx, xp.cols(l, l + r), saved.xa);
  if (h_done || lora_fwd(p) == LoraKernels::Separate) {
    if (!h_done) swiglu_forward(ctx, p, saved.gate_up, saved.h);
    grouped_matmul(ctx, form.fwd, saved.h, offsets, w.down_a, saved.ha);
  } else {
    dispatch(MT_NAMED_OP_BODIES("grouped_ffn_forward", grouped_ffn_lora_swiglu_ha),
             {&saved.gate_up, &w.down_a, &saved.h, &saved.ha}, ctx, p, saved.gate_up, offsets,
             w.down_a, saved.h, saved.ha);
  }
  grouped_matmul(ctx, form.fwd_down, padded_rows(saved.h, r), offsets,
                 padded_weight(w.down, r).narrow(1, 0, l), y);
}

// Backward per pass: dr = s dY B_down and dB_down read dY once, dr into dY's padding; the down
// dX GEMM reads [dY | dr] against [W_down ; A_down] and writes the whole dh (N F) (on the GPU
// one GEMM forms dr and dB from the dY tiles it holds: grouped_ffn_lora_dx); SwiGLU's
// backward reads gate_up and dh and writes dgate_up (5 N F) into a [N, 2F + r] view (of a
// grouped_ffn_row_pitch(2F, r) buffer) whose padding the gate/up projection's dr = s dgate_up B
// fills, in the same pass on the GPU as dB_gu and dA_down = dr_down^T h
// (grouped_ffn_lora_swiglu_backward_grads: session 13 read dgate_up and h once more for them,
// 3 N F); the gate/up dX GEMM reads [dgate_up | dr] against [W_gu ; A_gu] and writes dX (where
// lora_bwd is Separate, on the GPU forming dr and dB_gu itself: grouped_ffn_lora_dx). dA_gu =
// dr^T X and, with a trained base, dW stay separate grouped products.
void backward_kconcat(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                      const Tensor& offsets, const GroupedFfnWeights& w,
                      const GroupedFfnSaved& saved, const Tensor& dy, Tensor& dx,
                      GroupedFfnWeights& grads) {
  const int64_t l = p.in, F = p.ffn, r = p.lora_rank, N = p.rows;
  const DType at = x.dtype();
  const Forms form(p);
  ArenaScope scope(ctx.workspace());
  Tensor dyp;
  if (p.padded_rows && dy.stride(0) == grouped_ffn_rows_pitch(p)) {
    dyp = padded_rows(dy, r);
  } else {  // one copy of dY: its rows have no padding to lend
    dyp = padded_scratch(ctx, N, l, r, at);
    Tensor head = dyp.cols(0, l);
    ops::copy(ctx, dy, head);
  }
  const auto grad = [](const Tensor& g) { return has(g) ? g : Tensor(); };
  const Tensor xa = kconcat_xa(p, x, saved);
  Tensor dr_down = dyp.cols(l, l + r), db_down = grad(grads.down_b);
  Tensor dh = ctx.workspace().alloc({N, F}, at);
  const Tensor w_down_dx = padded_weight(w.down, r).narrow(2, 0, F);
  dispatch(MT_NAMED_OP_BODIES("grouped_ffn_backward", grouped_ffn_lora_dx),
           {&dyp, &w.down_b, &saved.ha, &w_down_dx, &db_down, &dh}, ctx, p, dyp, offsets, w.down_b,
           saved.ha, w_down_dx, db_down, dh);
  if (has(grads.down)) grouped_matmul(ctx, form.dw_base, dy, offsets, saved.h, grads.down);

  Tensor dgp = padded_scratch(ctx, N, 2 * F, r, at);
  Tensor dgu = dgp.cols(0, 2 * F), dr_gu = dgp.cols(2 * F, 2 * F + r);
  Tensor db_gu = grad(grads.gate_up_b), da_down = grad(grads.down_a);
  const Tensor w_gu_dx = padded_weight(w.gate_up, r).narrow(2, 0, l);
  if (lora_bwd(p) == LoraKernels::Separate) {
    if (has(da_down)) grouped_matmul(ctx, form.dw, dr_down, offsets, saved.h, da_down);
    swiglu_backward(ctx, p, saved.gate_up, dh, dgu);
    dispatch(MT_NAMED_OP_BODIES("grouped_ffn_backward", grouped_ffn_lora_dx),
             {&dgp, &w.gate_up_b, &xa, &w_gu_dx, &db_gu, &dx}, ctx, p, dgp, offsets, w.gate_up_b,
             xa, w_gu_dx, db_gu, dx);
  } else {
    dispatch(MT_NAMED_OP_BODIES("grouped_ffn_backward", grouped_ffn_lora_swiglu_backward_grads),
             {&saved.gate_up, &dh, &saved.h, &dr_down, &xa, &w.gate_up_b, &dgu, &dr_gu, &db_gu,
              &da_down},
             ctx, p, saved.gate_up, dh, offsets, saved.h, dr_down, xa, w.gate_up_b, dgu, dr_gu,
             db_gu, da_down);
    grouped_matmul(ctx, form.dx, dgp, offsets, w_gu_dx, dx);
  }
  if (has(grads.gate_up)) grouped_matmul(ctx, form.dw_base, dgu, offsets, x, grads.gate_up);
  if (has(grads.gate_up_a)) grouped_matmul(ctx, form.dw, dr_gu, offsets, x, grads.gate_up_a);
}

}  // namespace

bool grouped_ffn_kconcat(const GroupedFfnParams& p, Device device, DType at) {
  // bf16 rows at the weights' padded pitches (in + r, F + r) stay 16-byte multiples, as TMA and
  // the skinny kernels' 16-byte loads want; the rank-r products run on the skinny kernels
  // (ops/cuda/lora_grouped.h: ranks that are multiples of 8 up to 64).
  const int64_t r = p.lora_rank;
  return device == Device::CUDA && at == DType::BF16 && r > 0 && r <= 64 && r % 8 == 0 &&
         p.in % 8 == 0 && p.ffn % 8 == 0;
}

void grouped_ffn_interleave_gate_up(Context& ctx, const Tensor& w, Tensor& out, bool inverse) {
  MT_CHECK(w.ndim() == 3 && w.dim(1) % (2 * kGateUpInterleave) == 0, ShapeError,
           "grouped_ffn_interleave_gate_up: experts.gate_up_proj ", w.shape(),
           " needs [E, 2F, in] with F a multiple of ", kGateUpInterleave);
  expect_dims(out, w.shape(), "grouped_ffn_interleave_gate_up out");
  const int64_t F = w.dim(1) / 2, B = kGateUpInterleave;
  MT_CHECK(w.raw() != out.raw(), ValueError, "grouped_ffn_interleave_gate_up: out aliases w");
  // Block j of the interleaved rows (j even: gate, odd: up) is the block of the [g | u] rows at
  // `from`.
  for (int64_t j = 0; j < 2 * F / B; ++j) {
    const int64_t at = j * B, from = j % 2 * F + j / 2 * B;
    const int64_t src = inverse ? at : from, dst = inverse ? from : at;
    Tensor block = out.narrow(1, dst, dst + B);
    ops::copy(ctx, w.narrow(1, src, src + B), block);
  }
}

bool grouped_ffn_padded(const Tensor& w, int64_t r) {
  if (!w.defined() || w.ndim() != 3 || r <= 0 || w.raw() == nullptr) return false;
  const int64_t out = w.dim(1), in = w.dim(2);
  const int64_t pitch = grouped_ffn_row_pitch(in, r);
  return w.stride(2) == 1 && w.stride(1) == pitch && w.stride(0) == (out + r) * pitch;
}

Tensor grouped_ffn_pad_weight(const Tensor& w, int64_t r) {
  MT_CHECK(w.ndim() == 3 && r > 0, ShapeError, "grouped_ffn_pad_weight: ", w.shape(), ", rank ", r);
  if (grouped_ffn_padded(w, r)) return w;
  const int64_t E = w.dim(0), out = w.dim(1), in = w.dim(2);
  const Tensor buf =
      Tensor::zeros({E, out + r, grouped_ffn_row_pitch(in, r)}, w.dtype(), w.device());
  Tensor block = buf.narrow(1, 0, out).narrow(2, 0, in);
  block.copy_from(w);
  return block;
}

void grouped_ffn_plan(const GroupedFfnParams& p, ArenaPlan& plan) {
  plan.add({p.rows, 2 * p.ffn});
  if (saves_h(p) && p.lora_rank == 0) plan.add({p.rows, p.ffn});  // with LoRA: below
  if (p.lora_rank > 0) {
    plan.add({p.rows, p.lora_rank});
    if (grouped_ffn_kconcat(p, plan.device(), plan.activations())) {  // as alloc_saved lays out
      plan.add({p.rows, grouped_ffn_row_pitch(p.ffn, p.lora_rank)});
    } else {
      plan.add({p.rows, p.lora_rank});
      plan.add({p.rows, p.ffn});
    }
  }
}

GroupedFfnSaved grouped_ffn_alloc_saved(const GroupedFfnParams& p, Arena& arena, DType at) {
  GroupedFfnSaved s;
  s.gate_up = arena.alloc({p.rows, 2 * p.ffn}, at);
  if (saves_h(p) && p.lora_rank == 0) s.h = arena.alloc({p.rows, p.ffn}, at);  // LoRA: below
  if (p.lora_rank > 0) {
    s.xa = arena.alloc({p.rows, p.lora_rank}, at);
    if (grouped_ffn_kconcat(p, s.xa.device(), at)) {  // h and ha side by side: [h | ha]
      const Tensor hp = arena.alloc({p.rows, grouped_ffn_row_pitch(p.ffn, p.lora_rank)}, at);
      s.h = hp.cols(0, p.ffn);
      s.ha = hp.cols(p.ffn, p.ffn + p.lora_rank);
    } else {
      s.ha = arena.alloc({p.rows, p.lora_rank}, at);
      s.h = arena.alloc({p.rows, p.ffn}, at);
    }
  }
  return s;
}

void grouped_ffn_forward(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                         const Tensor& offsets, const GroupedFfnWeights& w, Tensor& y,
                         GroupedFfnSaved& saved) {
  check(p, x, offsets, w);
  const int64_t l = p.in, F = p.ffn, r = p.lora_rank, N = p.rows;
  expect_shape(y, {N, l}, "grouped_ffn y");
  expect_shape(saved.gate_up, {N, 2 * F}, "grouped_ffn saved gate_up");
  if (r > 0) {
    expect_shape(saved.xa, {N, r}, "grouped_ffn saved xa");
    expect_dims(saved.ha, {N, r}, "grouped_ffn saved ha");
  }
  if (saves_h(p)) expect_dims(saved.h, {N, F}, "grouped_ffn saved h");
  if (r > 0 && kconcat_call(p, x, w, saved))
    return forward_kconcat(ctx, p, x, offsets, w, y, saved);
  const float s = p.lora_scale();
  const Forms form(p);
  // Traffic over HBM per pass, in elements (b bytes each; N rows, d = in, weights read once):
  // the gate/up GEMM reads X (N d) and writes gate_up (2 N F); SwiGLU reads 2 N F and writes h
  // (N F); the down GEMM reads h (N F) and writes y (N d). With LoRA each projection adds a read
  // of its input for X A^T (N d or N F, writing N r); the gate/up projection's adapter term then
  // rides with SwiGLU (gate_up read and written once more), the down projection's is written
  // into y first and read back by the base GEMM (beta = 1; see with_lora).
  // The down projection: y = h W^T + s (h A^T) B^T, with h A^T kept in `ha`.
  const auto project = [&](const Tensor& in, const Tensor& wt, const Tensor& a, const Tensor& b,
                           Tensor& xa, Tensor& out) {
    if (r == 0) return grouped_matmul(ctx, form.fwd_down, in, offsets, wt, out);
    grouped_matmul(ctx, form.fwd, in, offsets, a, xa);
    with_lora(
        in,
        [&](float beta) {
          grouped_matmul(ctx, scaled(form.fwd_down, 1.f, beta), in, offsets, wt, out);
        },
        [&](float beta) { grouped_matmul(ctx, scaled(form.fwd, s, beta), xa, offsets, b, out); });
  };
  ArenaScope scope(ctx.workspace());
  Tensor h = saves_h(p) ? saved.h : ctx.workspace().alloc({N, F}, x.dtype());
  if (r == 0) {
    if (!gate_up_swiglu(ctx, p, x, offsets, w.gate_up, saved.gate_up, h)) {
      grouped_matmul(ctx, form.fwd, x, offsets, w.gate_up, saved.gate_up);
      swiglu_forward(ctx, p, saved.gate_up, h);
    }
  } else {
    // The gate/up projection's base GEMM writes gate_up, then its adapter term and SwiGLU follow
    // in one pass on the GPU that leaves gate_up as it is (3 N F elements moved, where the up
    // product written first, read back by the base GEMM and then by SwiGLU moved 7 N F).
    grouped_matmul(ctx, form.fwd, x, offsets, w.gate_up_a, saved.xa);
    grouped_matmul(ctx, form.fwd, x, offsets, w.gate_up, saved.gate_up);
    lora_swiglu(ctx, p, saved.xa, offsets, w.gate_up_b, saved.gate_up, h);
  }

  project(h, w.down, w.down_a, w.down_b, saved.ha, y);
}

void grouped_ffn_backward(Context& ctx, const GroupedFfnParams& p, const Tensor& x,
                          const Tensor& offsets, const GroupedFfnWeights& w,
                          const GroupedFfnSaved& saved, const Tensor& dy, Tensor& dx,
                          GroupedFfnWeights& grads) {
  check(p, x, offsets, w);
  const int64_t l = p.in, F = p.ffn, r = p.lora_rank, N = p.rows;
  expect_dims(dy, {N, l}, "grouped_ffn dy");
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
  if (saves_h(p)) expect_dims(saved.h, {N, F}, "grouped_ffn saved h");
  // A K-concatenated forward saved the adapted gate_up, which the passes below would adapt again:
  // its own backward follows it, whatever dy's rows are.
  if (r > 0 && kconcat_call(p, x, w, saved))
    return backward_kconcat(ctx, p, x, offsets, w, saved, dy, dx, grads);
  const Forms form(p);

  // Scratch in the activations' type (f32 on the CPU; f32 or bf16 on the GPU).
  ArenaScope scope(ctx.workspace());
  const DType at = x.dtype();
  // h = swiglu(gate_up): forward's with LoRA or keep_h; otherwise formed again only for the pass
  // that reads it, dW_down, by SwiGLU's backward as it reads gate_up (a frozen base forms none).
  const bool need_h = g_dn || g_dna;
  Tensor h = saves_h(p) ? saved.h : need_h ? ctx.workspace().alloc({N, F}, at) : Tensor();
  Tensor dh = ctx.workspace().alloc({N, F}, at);
  Tensor dgu = ctx.workspace().alloc({N, 2 * F}, at);
  Tensor dr = ctx.workspace().alloc({N, r}, at);

  // Traffic per pass, in elements (N rows, d = in): the down projection's dX GEMM reads dY (N d)
  // and writes dh (N F), its dW GEMM reads dY and h (N d + N F); SwiGLU's backward reads gate_up
  // and dh (3 N F) and writes dgate_up (2 N F); the gate/up projection's dX GEMM reads dgate_up
  // (2 N F) and writes dX (N d), its dW GEMM reads dgate_up and X (2 N F + N d). With LoRA, per
  // projection: dr = s dOut B and dB read dOut (once together on the GPU, twice on the CPU) and
  // dA reads the projection's input; the gate/up projection's dr A writes dX before the base GEMM
  // reads it back, the down projection's joins SwiGLU's backward (which forms the adapted gate_up
  // again from xa in the same pass on the GPU: 5 N F elements moved, where writing dh's adapter
  // term first, adding the base into it and reading both gate_up and dh moved 7 N F).

  // dIn = dOut W (+ (s dOut B) A when `adapter_in`), with s dOut B in `dr`; the base and adapter
  // weight grads.
  const auto project_back = [&](const Tensor& dout, const Tensor& in, const Tensor& wt,
                                const Tensor& a, const Tensor& b, const Tensor& xa, Tensor& din,
                                Tensor& gw, Tensor& ga, Tensor& gb, bool adapter_in) {
    // dr = s dOut B and dB += s dOut^T xa: one pass over dOut on the GPU.
    if (r > 0) lora_out_grads(ctx, p, dout, offsets, b, xa, dr, gb);
    if (r == 0 || !adapter_in) {
      grouped_matmul(ctx, form.dx, dout, offsets, wt, din);
    } else {
      with_lora(
          dout,
          [&](float beta) {
            grouped_matmul(ctx, scaled(form.dx, 1.f, beta), dout, offsets, wt, din);
          },
          [&](float beta) {
            grouped_matmul(ctx, scaled(form.dx, 1.f, beta), dr, offsets, a, din);
          });
    }
    if (has(gw)) grouped_matmul(ctx, form.dw_base, dout, offsets, in, gw);
    if (r > 0 && has(ga)) grouped_matmul(ctx, form.dw, dr, offsets, in, ga);
  };
  if (r > 0) {
    project_back(dy, h, w.down, w.down_a, w.down_b, saved.ha, dh, grads.down, grads.down_a,
                 grads.down_b, false);
    // dh + dr A_down, with dr the down projection's
    lora_swiglu_backward(ctx, p, saved.gate_up, saved.xa, offsets, w.gate_up_b, dh, dr, w.down_a,
                         dgu);
  } else {
    // h formed beside dgate_up for dW_down (none read, or forward's kept)
    const bool form_h = g_dn && !p.keep_h;
    Tensor none, &h_out = form_h ? h : none;
    if (!down_swiglu_backward(ctx, p, dy, offsets, w.down, saved.gate_up, dgu, h_out)) {
      grouped_matmul(ctx, form.dx, dy, offsets, w.down, dh);
      if (form_h)
        swiglu_backward_with_h(ctx, p, saved.gate_up, dh, dgu, h);
      else
        swiglu_backward(ctx, p, saved.gate_up, dh, dgu);
    }
    if (g_dn) grouped_matmul(ctx, form.dw_base, dy, offsets, h, grads.down);
  }
  project_back(dgu, x, w.gate_up, w.gate_up_a, w.gate_up_b, saved.xa, dx, grads.gate_up,
               grads.gate_up_a, grads.gate_up_b, true);
}

}  // namespace mt::ops
