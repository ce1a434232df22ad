// Grouped matmul and the grouped SwiGLU experts on the GPU against the CPU engine, through
// harness/gpu_check.h. Without a GPU the GPU checks skip, saying so.
//
// The experts' bf16 bound is kBf16Multiple times the error of a CPU emulation (tolerance.h), which
// is honest only if the emulation rounds to bf16 wherever the GPU stores bf16. In the bf16 pass
// every activation-typed tensor of grouped_ffn (ops/grouped_ffn.cpp) is bf16 on the GPU: cuBLAS
// reads and writes C in its type (ops/cuda/grouped_matmul.cu), so the saved gate_up, xa, ha, y,
// and backward's dh, dr, dgu, dx are rounded at every write, twice where a LoRA term and a base
// term meet (gate_up: the base GEMM's write, then the adapter term added and rounded by the
// passes that compute h and dgu, which keep the sum in registers, the emulation's order; dh: the
// fused SwiGLU backward adds the down adapter's term in fp32 without storing it, one rounding
// fewer than the emulation's; elsewhere the GPU writes the LoRA term first, then the base GEMM
// adds into it with beta = 1: its first rounding is of the smaller term, so the emulation's order
// bounds it); the SwiGLU kernels (ops/cuda/grouped_ffn.cu, lora_swiglu.cu, lora_kconcat.cu) round h
// and dgu. With SwiGLU in the GEMMs' epilogues (GroupedGemmConfig :swiglu) backward never stores
// dh: its f32 accumulators meet SwiGLU's derivative, one rounding fewer than the emulation's.
// Parameter gradients are f32 on both devices.
// The CPU op keeps all of these in fp32, and an emulation that rounded only inputs and outputs put
// the GPU at up to 1.13 times the bound (y, dgu_A, ddown_B in 3 of 6 runs): ffn_emulated rounds at
// the GPU's stores.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness/gpu_check.h"
#include "harness/seed.h"
#include "ops/cuda/grouped_matmul.h"
#include "ops/elementwise.h"
#include "ops/grouped_ffn.h"
#include "ops/grouped_matmul.h"

namespace mt::test {
namespace {

// Every form with alpha and beta, over groups with empty ones (dW of an empty group is scaled).
TEST(CudaGroupedMatmul, AllFormsAlphaBetaEmptyGroups) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t N = 301, G = 9, in = 40, out = 24;
  Tensor off = Tensor::empty({G + 1}, DType::I32);
  std::vector<int32_t> cnt(G, 0);
  for (int64_t r = 0; r < N; ++r) ++cnt[1 + 3 * rng.below(3)];  // groups 1, 4, 7 only
  off.i32()[0] = 0;
  for (int64_t g = 0; g < G; ++g) off.i32()[g + 1] = off.i32()[g] + cnt[g];
  std::vector<In> ins = {{randn(rng, {N, in})},  {randn(rng, {G, out, in})},
                         {randn(rng, {N, out})}, {randn(rng, {N, out})},
                         {randn(rng, {N, in})},  {randn(rng, {G, out, in}), false}};
  run_case(
      "grouped_matmul forms", ins, {"xwt", "dyw", "dytx"},
      [&](Context& c, const std::vector<Tensor>& in_, bool gpu) -> std::vector<Tensor> {
        Tensor y = like(c, in_[3]), dx = like(c, in_[4]), dw = like(c, in_[5]);
        OP(grouped_matmul)
        (c, {.form = ops::GroupedForm::XWt, .alpha = 0.7f, .beta = 0.3f}, in_[0], off, in_[1], y);
        OP(grouped_matmul)
        (c, {.form = ops::GroupedForm::DyW, .alpha = -1.2f, .beta = 0.5f}, in_[2], off, in_[1], dx);
        OP(grouped_matmul)
        (c, {.form = ops::GroupedForm::DytX, .alpha = 0.9f, .beta = 0.5f}, in_[2], off, in_[0], dw);
        return {y, dx, dw};
      },
      seed);
}

// The bf16 forward and input-gradient forms run CUTLASS's Hopper kernel when rows and widths are
// 16-byte multiples (ops/cuda/grouped_matmul.cu), cuBLAS's otherwise: many groups of uneven
// sizes against its 128 x 256 x 64 tiles (k = 264: a partial k tile; n = 200: a partial n tile),
// and widths of 36 and 20 that send the same call to cuBLAS.
TEST(CudaGroupedMatmul, TileEdgesAndTheUnalignedFallback) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  for (const auto& [in, out] : std::vector<std::pair<int64_t, int64_t>>{{264, 200}, {36, 20}}) {
    const int64_t N = 2000, G = 64;
    Tensor off = Tensor::empty({G + 1}, DType::I32);
    std::vector<int32_t> cnt(G, 0);
    for (int64_t r = 0; r < N; ++r) ++cnt[rng.below(G) * rng.below(2)];  // group 0 heavy
    off.i32()[0] = 0;
    for (int64_t g = 0; g < G; ++g) off.i32()[g + 1] = off.i32()[g] + cnt[g];
    std::vector<In> ins = {{randn(rng, {N, in})},
                           {randn(rng, {G, out, in})},
                           {randn(rng, {N, out})},
                           {randn(rng, {N, out})},
                           {randn(rng, {N, in})}};
    const std::string name = "grouped_matmul tiles in=" + std::to_string(in);
    run_case(
        name.c_str(), ins, {"xwt", "dyw"},
        [&](Context& c, const std::vector<Tensor>& in_, bool gpu) -> std::vector<Tensor> {
          Tensor y = like(c, in_[3]), dx = like(c, in_[4]);
          OP(grouped_matmul)
          (c, {.form = ops::GroupedForm::XWt, .alpha = 1.f, .beta = 0.f}, in_[0], off, in_[1], y);
          OP(grouped_matmul)
          (c, {.form = ops::GroupedForm::DyW, .alpha = 0.5f, .beta = 1.f}, in_[2], off, in_[1], dx);
          return {y, dx};
        },
        seed);
  }
}

// The forward forms' mainloops stop the last k-tile at the last k16 block that holds some k < K
// (ops/cuda/cutlass/tail_trimmed_mainloop.cuh): every residue of K modulo the 64-wide k-tile, and
// K below one tile, on every compiled kernel of the forward forms, in both forms (XWt's K is in,
// DyW's out). A block count rounded down would drop the columns past it.
TEST(CudaGroupedMatmul, EveryKResidueOnEveryForwardKernel) {
  REQUIRE_GPU();
  const std::vector<int64_t> ks = {8, 24, 40, 56, 64, 136, 144, 152, 160, 168, 176, 184, 192};
  for (int kernel = 0; kernel < static_cast<int>(std::size(ops::kGroupedGemmKernels)); ++kernel) {
    for (size_t i = 0; i < ks.size(); ++i) {
      const int64_t in = ks[i], out = ks[(i + 5) % ks.size()], G = 6;
      const uint64_t seed = fresh_seed();
      Rng rng(seed);
      Tensor off = Tensor::empty({G + 1}, DType::I32);
      off.i32()[0] = 0;
      for (int64_t g = 0; g < G; ++g)
        off.i32()[g + 1] = off.i32()[g] + static_cast<int32_t>(g == 2 ? 0 : 1 + rng.below(300));
      const int64_t N = off.i32()[G];
      std::vector<In> ins = {{randn(rng, {N, in})},
                             {randn(rng, {G, out, in})},
                             {randn(rng, {N, out})},
                             {randn(rng, {N, out})},
                             {randn(rng, {N, in})}};
      const ops::GroupedGemmConfig cfg{.kernel = kernel};
      const std::string name = "grouped_matmul k residues " + ops::grouped_gemm_config_name(cfg) +
                               " in=" + std::to_string(in) + " out=" + std::to_string(out);
      run_case(
          name.c_str(), ins, {"xwt", "dyw"},
          [&](Context& c, const std::vector<Tensor>& in_, bool gpu) -> std::vector<Tensor> {
            Tensor y = like(c, in_[3]), dx = like(c, in_[4]);
            OP(grouped_matmul)
            (c, {.form = ops::GroupedForm::XWt, .gemm = cfg}, in_[0], off, in_[1], y);
            OP(grouped_matmul)
            (c, {.form = ops::GroupedForm::DyW, .gemm = cfg}, in_[2], off, in_[1], dx);
            return {y, dx};
          },
          seed);
    }
  }
}

struct FfnSetup {
  int64_t rows = 0, experts = 0, in = 0, ffn = 0, rank = 0;
  float alpha = 16.f;
  bool frozen_base = false;
  // Skewed counts: expert 0 takes most rows, experts 2 and E-1 one row each, every third empty.
  bool skewed = false;
  std::optional<ops::GroupedGemmConfig> gemm;
  // The K-concatenation path (ops/grouped_ffn.h) in the GPU's bf16 pass: the base weights in
  // their padded buffers and h beside ha; with pad_rows x and dy lend their padding too (else the
  // op copies them into padded scratch).
  bool kconcat = false, pad_rows = false;
  // GroupedFfnParams::weight_grads_zero: the base weights' pre-filled (random) grads are then
  // overwritten on both devices, where they are otherwise added into.
  bool weight_grads_zero = false;
  bool s13 = false;  // GroupedFfnParams::lora_s13_kernels
  // GroupedFfnParams::lora_fwd / lora_bwd (their defaults when unset)
  std::optional<ops::LoraKernels> lora_fwd, lora_bwd, lora_og, lora_xa;  // lora_og: lora_out_grads
  // With pad_rows: x padded, dy not (the backward then takes the separate passes, which must find
  // X A^T where the K-concatenated forward left it: in x's padding).
  bool unpadded_dy = false;
  bool keep_h = false;  // GroupedFfnParams::keep_h
  // GroupedFfnParams::interleaved_gate_up: the (random) gate_up weights read as interleaved.
  bool interleaved = false;
};

// Inputs: x, dy, gate_up, down, their pre-filled gradients, then (LoRA) the four factors and
// theirs.
struct FfnCase {
  ops::GroupedFfnParams p;
  Tensor off;  // the plan's host copy on either device
  std::vector<In> ins;
  std::vector<std::string> names;
};

FfnCase ffn_case(const FfnSetup& s, Rng& rng) {
  const int64_t N = s.rows, E = s.experts, l = s.in, F = s.ffn, r = s.rank;
  FfnCase k;
  k.p = {.rows = N, .experts = E, .in = l, .ffn = F, .lora_rank = r, .lora_alpha = s.alpha};
  k.p.gemm = s.gemm;
  k.p.weight_grads_zero = s.weight_grads_zero;
  k.p.lora_s13_kernels = s.s13;
  if (s.lora_fwd) k.p.lora_fwd = *s.lora_fwd;
  if (s.lora_bwd) k.p.lora_bwd = *s.lora_bwd;
  if (s.lora_og) k.p.lora_out_grads = *s.lora_og;
  if (s.lora_xa) k.p.lora_xa = *s.lora_xa;
  k.p.keep_h = s.keep_h;
  k.p.interleaved_gate_up = s.interleaved;
  k.off = Tensor::empty({E + 1}, DType::I32);
  std::vector<int32_t> cnt(static_cast<size_t>(E), 0);
  if (s.skewed) {
    int64_t given = 0;
    for (int64_t e = 1; e < E; ++e) {
      cnt[e] = e % 3 == 1 ? 0 : (e == 2 || e == E - 1) ? 1 : static_cast<int32_t>(rng.below(40));
      given += cnt[e];
    }
    MT_CHECK(given < N, ValueError, "ffn_case: ", N, " rows leave none to the hot expert");
    cnt[0] = static_cast<int32_t>(N - given);
  } else {
    for (int64_t i = 0; i < N; ++i) {
      int64_t e = rng.below(E);
      if (e % 3 == 1) e = (e + 1) % E;  // every third expert empty
      ++cnt[e];
    }
  }
  k.off.i32()[0] = 0;
  for (int64_t e = 0; e < E; ++e) k.off.i32()[e + 1] = k.off.i32()[e] + cnt[e];
  const Shape gu{E, 2 * F, l}, dn{E, l, F}, gua{E, r, l}, gub{E, 2 * F, r}, dna{E, r, F},
      dnb{E, l, r};
  k.ins = {{randn(rng, {N, l})},  {randn(rng, {N, l})},          {randn(rng, gu, 0.2)},
           {randn(rng, dn, 0.2)}, {randn(rng, gu, 1e-2), false}, {randn(rng, dn, 1e-2), false}};
  if (r > 0) {
    for (const Shape& sh : {gua, gub, dna, dnb}) k.ins.push_back({randn(rng, sh, 0.2)});
    for (const Shape& sh : {gua, gub, dna, dnb}) k.ins.push_back({randn(rng, sh, 1e-2), false});
  }
  k.names = {"y", "dx"};
  if (!s.frozen_base) k.names.insert(k.names.end(), {"dgate_up", "ddown"});
  if (r > 0) k.names.insert(k.names.end(), {"dgu_A", "dgu_B", "ddown_A", "ddown_B"});
  return k;
}

// Whether this pass of a kconcat setup runs the K-concatenation path: the GPU's bf16 pass.
bool kconcat_pass(const FfnSetup& s, const std::vector<Tensor>& in) {
  const ops::GroupedFfnParams p{
      .rows = s.rows, .experts = s.experts, .in = s.in, .ffn = s.ffn, .lora_rank = s.rank};
  return s.kconcat && ops::grouped_ffn_kconcat(p, in[0].device(), in[0].dtype());
}

// The op's operands on the context's device, from the case's inputs.
struct FfnOperands {
  ops::GroupedFfnWeights w, g;
  ops::GroupedFfnSaved saved;
  Tensor y, dx;
};

FfnOperands ffn_operands(Context& c, const FfnSetup& s, const std::vector<Tensor>& in) {
  const int64_t N = s.rows, l = s.in, F = s.ffn, r = s.rank;
  const DType at = in[0].dtype();
  FfnOperands o;
  o.w = {.gate_up = in[2], .down = in[3]};
  if (!s.frozen_base) {
    o.g.gate_up = like(c, in[4]);
    o.g.down = like(c, in[5]);
  }
  if (r > 0) {
    o.w.gate_up_a = in[6];
    o.w.gate_up_b = in[7];
    o.w.down_a = in[8];
    o.w.down_b = in[9];
    o.g.gate_up_a = like(c, in[10]);
    o.g.gate_up_b = like(c, in[11]);
    o.g.down_a = like(c, in[12]);
    o.g.down_b = like(c, in[13]);
    o.saved.xa = out(c, {N, r}, at);
    o.saved.ha = out(c, {N, r}, at);
    o.saved.h = out(c, {N, F}, at);
  } else if (s.keep_h) {
    o.saved.h = out(c, {N, F}, at);
  }
  o.saved.gate_up = out(c, {N, 2 * F}, at);
  o.y = out(c, {N, l}, at);
  o.dx = out(c, {N, l}, at);
  if (kconcat_pass(s, in)) {
    o.w.gate_up = ops::grouped_ffn_pad_weight(in[2], r);
    o.w.down = ops::grouped_ffn_pad_weight(in[3], r);
    // NaN: the op writes ha before the GEMM reads it.
    const Tensor hp = out(c, {N, ops::grouped_ffn_row_pitch(F, r)}, at);
    o.saved.h = hp.cols(0, F);
    o.saved.ha = hp.cols(F, F + r);
  }
  return o;
}

std::vector<Tensor> ffn_results(const FfnSetup& s, const FfnOperands& o) {
  std::vector<Tensor> res = {o.y, o.dx};
  if (!s.frozen_base) res.insert(res.end(), {o.g.gate_up, o.g.down});
  if (s.rank > 0) res.insert(res.end(), {o.g.gate_up_a, o.g.gate_up_b, o.g.down_a, o.g.down_b});
  return res;
}

// [rows, grouped_ffn_row_pitch(w, r)] NaN-filled on the context's device with t in its first w
// columns, returned as the view of those columns (the MoE layer's padded rows).
Tensor padded_copy(Context& c, const Tensor& t, int64_t r) {
  const Tensor buf = out(c, {t.dim(0), ops::grouped_ffn_row_pitch(t.dim(1), r)}, t.dtype());
  Tensor head = buf.cols(0, t.dim(1));
  ops::copy(c, t, head);
  return head;
}

std::vector<Tensor> ffn_op(Context& c, const FfnSetup& s, const FfnCase& k,
                           const std::vector<Tensor>& in) {
  FfnOperands o = ffn_operands(c, s, in);
  ops::GroupedFfnParams p = k.p;
  Tensor x = in[0], dy = in[1];
  const int64_t l = s.in, r = s.rank;
  if (kconcat_pass(s, in)) {
    // The path's preconditions hold (else a fallback would pass this case unexercised), and the
    // padded weights hold W.
    EXPECT_TRUE(ops::grouped_ffn_padded(o.w.gate_up, r) && ops::grouped_ffn_padded(o.w.down, r));
    EXPECT_TRUE(host_bytes(o.w.gate_up.clone()) == host_bytes(in[2])) << "padded gate_up";
    EXPECT_TRUE(host_bytes(o.w.down.clone()) == host_bytes(in[3])) << "padded down";
    if (s.pad_rows) {
      p.padded_rows = true;
      x = padded_copy(c, in[0], r);
      if (!s.unpadded_dy) dy = padded_copy(c, in[1], r);
    }
  }
  ops::grouped_ffn_forward(c, p, x, k.off, o.w, o.y, o.saved);
  if (p.padded_rows && s.s13) {  // the rows' padding holds X A^T, as saved for dB (session 13;
                                 // now backward reads it there and saved.xa stays unwritten)
    const Tensor padded(x.raw(), {s.rows, x.stride(0)}, x.dtype(), x.device());
    EXPECT_TRUE(host_bytes(padded.cols(l, l + r).clone()) == host_bytes(o.saved.xa))
        << "x's padding after forward";
  }
  ops::grouped_ffn_backward(c, p, x, k.off, o.w, o.saved, dy, o.dx, o.g);
  return ffn_results(s, o);
}

// grouped_ffn_forward and grouped_ffn_backward composed again on the CPU, from the same
// grouped_matmul and SwiGLU calls in the same order; with `bf16`, every tensor the GPU keeps in
// the activations' type is rounded to bf16 each time it is written (after the base term and again
// after a LoRA term is added into it), as the GPU stores it.
std::vector<Tensor> ffn_emulated(Context& c, const FfnSetup& s, const FfnCase& k,
                                 const std::vector<Tensor>& in, bool bf16) {
  const int64_t N = s.rows, F = s.ffn, r = s.rank;
  FfnOperands o = ffn_operands(c, s, in);
  const auto store = [bf16](Tensor& t) {
    if (bf16) t.copy_from(round_bf16(t));
  };
  const auto mm = [&](ops::GroupedForm form, float alpha, float beta, const Tensor& a,
                      const Tensor& b, Tensor& dst) {
    ops::grouped_matmul(c, {.form = form, .alpha = alpha, .beta = beta}, a, k.off, b, dst);
  };
  constexpr auto XWt = ops::GroupedForm::XWt, DyW = ops::GroupedForm::DyW,
                 DytX = ops::GroupedForm::DytX;
  const float ls = k.p.lora_scale();
  const Tensor &x = in[0], &dy = in[1];
  const ops::GroupedFfnWeights& w = o.w;
  ops::GroupedFfnWeights& g = o.g;
  Tensor& gu = o.saved.gate_up;

  mm(XWt, 1.f, 0.f, x, w.gate_up, gu);
  store(gu);
  if (r > 0) {
    mm(XWt, 1.f, 0.f, x, w.gate_up_a, o.saved.xa);
    store(o.saved.xa);
    mm(XWt, ls, 1.f, o.saved.xa, w.gate_up_b, gu);
    store(gu);
  }
  // h from the adapted gate_up (the GPU keeps the sum in registers, rounded as stored here).
  Tensor h = Tensor::empty({N, F});
  const int64_t block = ops::grouped_ffn_gate_up_block(k.p);
  ops::cpu::grouped_ffn_swiglu_forward(c, gu, h, block);
  store(h);
  mm(XWt, 1.f, 0.f, h, w.down, o.y);
  store(o.y);
  if (r > 0) {
    mm(XWt, 1.f, 0.f, h, w.down_a, o.saved.ha);
    store(o.saved.ha);
    mm(XWt, ls, 1.f, o.saved.ha, w.down_b, o.y);
    store(o.y);
  }

  Tensor dh = Tensor::empty({N, F}), dgu = Tensor::empty({N, 2 * F}), dr = Tensor::empty({N, r});
  mm(DyW, 1.f, 0.f, dy, w.down, dh);
  store(dh);
  const float dw_beta = s.weight_grads_zero ? 0.f : 1.f;
  if (g.down.defined()) mm(DytX, 1.f, dw_beta, dy, h, g.down);
  if (r > 0) {
    mm(DyW, ls, 0.f, dy, w.down_b, dr);
    store(dr);
    mm(DyW, 1.f, 1.f, dr, w.down_a, dh);
    store(dh);
    mm(DytX, ls, 1.f, dy, o.saved.ha, g.down_b);
    mm(DytX, 1.f, 1.f, dr, h, g.down_a);
  }
  ops::cpu::grouped_ffn_swiglu_backward(c, gu, dh, dgu, block);
  store(dgu);
  mm(DyW, 1.f, 0.f, dgu, w.gate_up, o.dx);
  store(o.dx);
  if (g.gate_up.defined()) mm(DytX, 1.f, dw_beta, dgu, x, g.gate_up);
  if (r > 0) {
    mm(DyW, ls, 0.f, dgu, w.gate_up_b, dr);
    store(dr);
    mm(DyW, 1.f, 1.f, dr, w.gate_up_a, o.dx);
    store(o.dx);
    mm(DytX, ls, 1.f, dgu, o.saved.xa, g.gate_up_b);
    mm(DytX, 1.f, 1.f, dr, x, g.gate_up_a);
  }
  return ffn_results(s, o);
}

void ffn_check(const char* name, const FfnSetup& s) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const FfnCase k = ffn_case(s, rng);
  run_case(
      name, k.ins, k.names,
      [&](Context& c, const std::vector<Tensor>& in, bool) { return ffn_op(c, s, k, in); }, seed, 0,
      [&](Context& c, const std::vector<Tensor>& in, bool) {
        return ffn_emulated(c, s, k, in, true);
      });
}

const FfnSetup kFfnSetups[] = {
    {.rows = 10, .experts = 8, .in = 19, .ffn = 23},
    {.rows = 53, .experts = 5, .in = 19, .ffn = 23},
    {.rows = 41, .experts = 7, .in = 19, .ffn = 23, .rank = 3, .alpha = 8.f},
    {.rows = 41, .experts = 7, .in = 19, .ffn = 23, .rank = 3, .frozen_base = true},
    {.rows = 16384, .experts = 64, .in = 256, .ffn = 128, .rank = 8},
};

TEST(CudaGroupedFfn, SwigluExpertsWithLoraForwardBackward) {
  REQUIRE_GPU();
  ffn_check("grouped_ffn zero-token experts", kFfnSetups[0]);
  ffn_check("grouped_ffn odd sizes", kFfnSetups[1]);
  ffn_check("grouped_ffn lora", kFfnSetups[2]);
  ffn_check("grouped_ffn lora frozen base", kFfnSetups[3]);
  ffn_check("grouped_ffn 16384 rows 64 experts lora", kFfnSetups[4]);
}

// The experts on the skinny kernels' path (ops/cuda/lora_grouped.h: bf16, widths multiples of 8,
// ranks 16 and 32), with partial tiles (in 264, ffn 136) and the frozen base.
TEST(CudaGroupedFfn, SkinnyLoraPathRanks16And32) {
  REQUIRE_GPU();
  ffn_check("grouped_ffn skinny lora r16",
            {.rows = 3000, .experts = 16, .in = 264, .ffn = 136, .rank = 16});
  ffn_check("grouped_ffn skinny lora r32 frozen",
            {.rows = 3000, .experts = 16, .in = 264, .ffn = 136, .rank = 32, .frozen_base = true});
}

// Expert LoRA carried in the base GEMMs' K dimension (ops/grouped_ffn.h, K-concatenation) in the
// bf16 pass, against the same emulation as the separate passes (the path rounds each adapted
// output once where the emulation rounds twice, and s B once into the padded weight): forward,
// backward with dX, dA and dB, frozen and trained base; skewed counts (a hot expert, one-token
// experts, every third empty); rows padded by the caller or copied by the op; rank 64 takes the
// two-call dr / dB form (the one-pass kernel stops at 32); widths with partial tiles.
TEST(CudaGroupedFfn, KConcatLoraInTheBaseGemms) {
  REQUIRE_GPU();
  ffn_check("grouped_ffn kconcat r16 skewed frozen, padded rows", {.rows = 3000,
                                                                   .experts = 16,
                                                                   .in = 264,
                                                                   .ffn = 136,
                                                                   .rank = 16,
                                                                   .frozen_base = true,
                                                                   .skewed = true,
                                                                   .kconcat = true,
                                                                   .pad_rows = true});
  ffn_check("grouped_ffn kconcat r8 trained base, copied rows",
            {.rows = 2000, .experts = 9, .in = 64, .ffn = 48, .rank = 8, .kconcat = true});
  // Rank 16 and `in` a multiple of 64: xa formed in the gate/up GEMM (GroupedFfnParams::lora_xa =
  // Gemm), the backward reading it from x's padding (dB_gu) or from saved.xa.
  ffn_check("grouped_ffn kconcat r16 skewed trained base, padded rows, xa in the GEMM",
            {.rows = 3000,
             .experts = 16,
             .in = 256,
             .ffn = 136,
             .rank = 16,
             .skewed = true,
             .kconcat = true,
             .pad_rows = true,
             .lora_xa = ops::LoraKernels::Gemm});
  // 2F a multiple of 128 as well: the gate/up projection's dX GEMM forms dr_gu and dB_gu too
  // (GroupedFfnParams::lora_dr, with lora_bwd Separate).
  ffn_check("grouped_ffn kconcat r16 skewed trained base, padded rows, dr in both dX GEMMs",
            {.rows = 3000,
             .experts = 16,
             .in = 256,
             .ffn = 192,
             .rank = 16,
             .skewed = true,
             .kconcat = true,
             .pad_rows = true});
  ffn_check("grouped_ffn kconcat r16 frozen, copied rows, xa in the GEMM",
            {.rows = 2000,
             .experts = 9,
             .in = 128,
             .ffn = 48,
             .rank = 16,
             .frozen_base = true,
             .kconcat = true,
             .lora_xa = ops::LoraKernels::Gemm});
  ffn_check("grouped_ffn kconcat r16 skewed frozen, padded rows, session 13's kernels",
            {.rows = 3000,
             .experts = 16,
             .in = 264,
             .ffn = 136,
             .rank = 16,
             .frozen_base = true,
             .skewed = true,
             .kconcat = true,
             .pad_rows = true,
             .s13 = true});
  ffn_check("grouped_ffn kconcat r16 skewed frozen, padded rows, staged forward and backward",
            {.rows = 3000,
             .experts = 16,
             .in = 264,
             .ffn = 136,
             .rank = 16,
             .frozen_base = true,
             .skewed = true,
             .kconcat = true,
             .pad_rows = true,
             .lora_fwd = ops::LoraKernels::Staged,
             .lora_bwd = ops::LoraKernels::Staged});
  ffn_check("grouped_ffn kconcat r16 skewed trained base, padded rows, registers everywhere",
            {.rows = 3000,
             .experts = 16,
             .in = 264,
             .ffn = 136,
             .rank = 16,
             .skewed = true,
             .kconcat = true,
             .pad_rows = true,
             .lora_fwd = ops::LoraKernels::Registers,
             .lora_bwd = ops::LoraKernels::Registers,
             .lora_og = ops::LoraKernels::Registers,
             .lora_xa = ops::LoraKernels::Registers});
  ffn_check("grouped_ffn kconcat r32 skewed frozen, padded rows, registers everywhere",
            {.rows = 3000,
             .experts = 16,
             .in = 264,
             .ffn = 136,
             .rank = 32,
             .frozen_base = true,
             .skewed = true,
             .kconcat = true,
             .pad_rows = true,
             .lora_fwd = ops::LoraKernels::Registers,
             .lora_bwd = ops::LoraKernels::Registers,
             .lora_og = ops::LoraKernels::Registers,
             .lora_xa = ops::LoraKernels::Registers});
  ffn_check("grouped_ffn kconcat r32 skewed trained base, padded rows", {.rows = 3000,
                                                                         .experts = 16,
                                                                         .in = 264,
                                                                         .ffn = 136,
                                                                         .rank = 32,
                                                                         .skewed = true,
                                                                         .kconcat = true,
                                                                         .pad_rows = true});
  ffn_check("grouped_ffn kconcat r16 trained base, padded rows, unpadded dy",
            {.rows = 1200,
             .experts = 8,
             .in = 128,
             .ffn = 64,
             .rank = 16,
             .kconcat = true,
             .pad_rows = true,
             .unpadded_dy = true});
  ffn_check("grouped_ffn kconcat r64 frozen, padded rows", {.rows = 1500,
                                                            .experts = 8,
                                                            .in = 128,
                                                            .ffn = 64,
                                                            .rank = 64,
                                                            .frozen_base = true,
                                                            .kconcat = true,
                                                            .pad_rows = true});
  ffn_check("grouped_ffn kconcat 16384 rows 64 experts r16 frozen", {.rows = 16384,
                                                                     .experts = 64,
                                                                     .in = 256,
                                                                     .ffn = 128,
                                                                     .rank = 16,
                                                                     .frozen_base = true,
                                                                     .kconcat = true,
                                                                     .pad_rows = true});
}

// The weight-gradient hint (GroupedFfnParams::weight_grads_zero): dW written, with empty experts'
// blocks zeroed, on the separate-pass path (CUTLASS's grouped GEMM with beta 0 at the larger
// size) and on the K-concatenation path with a trained base.
TEST(CudaGroupedFfn, WeightGradsWrittenUnderTheZeroHint) {
  REQUIRE_GPU();
  ffn_check("grouped_ffn dW written, empty experts",
            {.rows = 53, .experts = 5, .in = 19, .ffn = 23, .weight_grads_zero = true});
  ffn_check("grouped_ffn dW written, 4096 rows skewed", {.rows = 4096,
                                                         .experts = 16,
                                                         .in = 256,
                                                         .ffn = 128,
                                                         .skewed = true,
                                                         .weight_grads_zero = true});
  ffn_check("grouped_ffn kconcat r16 dW written, padded rows", {.rows = 3000,
                                                                .experts = 16,
                                                                .in = 264,
                                                                .ffn = 136,
                                                                .rank = 16,
                                                                .skewed = true,
                                                                .kconcat = true,
                                                                .pad_rows = true,
                                                                .weight_grads_zero = true});
}

// h kept from forward (GroupedFfnParams::keep_h: dW_down reads it, SwiGLU's backward forms none),
// with dW written and added into, a frozen base, and under a configuration that gives the down
// projection's forward the cooperative kernel (GroupedGemmConfig::down; its default is ping-pong)
// and the weight gradient the 128 x 16 epilogue.
TEST(CudaGroupedFfn, HKeptFromForward) {
  REQUIRE_GPU();
  ffn_check("grouped_ffn h kept, dW written, 4096 rows skewed", {.rows = 4096,
                                                                 .experts = 16,
                                                                 .in = 256,
                                                                 .ffn = 128,
                                                                 .skewed = true,
                                                                 .weight_grads_zero = true,
                                                                 .keep_h = true});
  ffn_check("grouped_ffn h kept, odd sizes",
            {.rows = 53, .experts = 5, .in = 19, .ffn = 23, .keep_h = true});
  ffn_check("grouped_ffn h kept, frozen",
            {.rows = 2000, .experts = 9, .in = 64, .ffn = 48, .frozen_base = true, .keep_h = true});
  ffn_check("grouped_ffn h kept, cooperative down projection, e16 dW",
            {.rows = 3000,
             .experts = 16,
             .in = 264,
             .ffn = 136,
             .skewed = true,
             .gemm = ops::parse_grouped_gemm_config(
                 "coop128x256c2x1:down=coop128x256c2x1:dw=coop128x256c2x1e16"),
             .keep_h = true});
}

// The bf16 emulation follows the op's own sequence of writes: without rounding it reproduces the
// CPU op bit for bit (a change to grouped_ffn that the emulation does not follow fails here, on
// any machine), and with rounding every result moves. Needs no GPU; the small setups cover every
// path (the large one adds only rows).
TEST(CudaGroupedFfn, Bf16EmulationIsTheCpuOpComposedAgain) {
  std::vector<FfnSetup> setups(kFfnSetups, kFfnSetups + 4);
  setups.push_back({.rows = 53, .experts = 5, .in = 19, .ffn = 23, .keep_h = true});
  for (const FfnSetup& s : setups) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(cat("rows ", s.rows, " rank ", s.rank, s.keep_h ? " h kept" : "", " seed=", seed,
                     " (", seed_note(), ")"));
    Rng rng(seed);
    const FfnCase k = ffn_case(s, rng);
    std::vector<Tensor> in;
    for (const In& i : k.ins) in.push_back(i.host);
    Context c(ContextOptions{.threads = 2, .seed = seed});
    const std::vector<Tensor> op = ffn_op(c, s, k, in), same = ffn_emulated(c, s, k, in, false),
                              rounded = ffn_emulated(c, s, k, in, true);
    ASSERT_EQ(op.size(), k.names.size());
    ASSERT_EQ(same.size(), op.size());
    ASSERT_EQ(rounded.size(), op.size());
    for (size_t j = 0; j < op.size(); ++j) {
      const size_t bytes = static_cast<size_t>(op[j].numel()) * sizeof(float);
      EXPECT_EQ(std::memcmp(op[j].f32(), same[j].f32(), bytes), 0)
          << k.names[j] << ": the emulation without rounding differs from grouped_ffn";
      EXPECT_NE(std::memcmp(op[j].f32(), rounded[j].f32(), bytes), 0)
          << k.names[j] << ": rounding the stored intermediates changed nothing";
    }
  }
}

// SwiGLU's backward that also forms h (where the base trains without LoRA, for dW_down) against
// the CPU's separate forward and backward: widths in 16-byte packs (F 136) and not (F 23), and a
// row-pitched dh / h pair (pitch F + 8) as the K-concatenation path lays rows out.
TEST(CudaGroupedFfn, SwigluBackwardFormsHInTheSamePass) {
  REQUIRE_GPU();
  for (const auto& [F, pad] :
       std::vector<std::pair<int64_t, int64_t>>{{136, 0}, {23, 0}, {136, 8}}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t N = 1000;
    const std::vector<In> ins = {{randn(rng, {N, 2 * F}, 2.0)}, {randn(rng, {N, F})}};
    const std::string name = cat("swiglu backward with h, F ", F, " pitch ", F + pad);
    run_case(
        name.c_str(), ins, {"dgate_up", "h"},
        [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
          Tensor dgu = out(c, {N, 2 * F}, in[0].dtype());
          if (!gpu) {
            Tensor h = out(c, {N, F}, in[0].dtype());
            ops::cpu::grouped_ffn_swiglu_backward(c, in[0], in[1], dgu, F);
            ops::cpu::grouped_ffn_swiglu_forward(c, in[0], h, F);
            return {dgu, h};
          }
          // dh and h at the same row pitch, in padded buffers.
          const Tensor dhp = out(c, {N, F + pad}, in[1].dtype()),
                       hp = out(c, {N, F + pad}, in[1].dtype());
          Tensor dh = dhp.cols(0, F), h = hp.cols(0, F);
          ops::copy(c, in[1], dh);
          ops::cuda::grouped_ffn_swiglu_backward_with_h(c, in[0], dh, dgu, h, F);
          return {dgu, h.clone()};
        },
        seed);
  }
}

// The grouped GEMM configurations by name (ops/grouped_matmul.h): every kernel with every
// swizzle and raster order, input-gradient kernel and weight-gradient kernel survives a round
// trip, and a wrong name is refused saying why.
TEST(CudaGroupedGemmConfig, NamesRoundTripAndWrongNamesAreRefused) {
  const int kernels = static_cast<int>(std::size(ops::kGroupedGemmKernels));
  for (int kernel = 0; kernel < kernels; ++kernel)
    for (int dx = -1; dx < kernels; ++dx)
      for (int wgrad = 0; wgrad < static_cast<int>(std::size(ops::kGroupedWgradKernels)); ++wgrad)
        for (int swizzle : {1, 2, 4, 8})
          for (bool along_n : {false, true}) {
            const ops::GroupedGemmConfig c{.kernel = kernel,
                                           .dx_kernel = dx,
                                           .wgrad = wgrad,
                                           .swizzle = swizzle,
                                           .along_n = along_n};
            const std::string name = ops::grouped_gemm_config_name(c);
            const ops::GroupedGemmConfig back = ops::parse_grouped_gemm_config(name);
            EXPECT_EQ(back.kernel, kernel) << name;
            // -1 and the forward kernel both mean the forward kernel.
            EXPECT_EQ(back.dx_kernel < 0 ? kernel : back.dx_kernel, dx < 0 ? kernel : dx) << name;
            EXPECT_EQ(back.wgrad, wgrad) << name;
            EXPECT_EQ(back.swizzle, swizzle) << name;
            EXPECT_EQ(back.along_n, along_n) << name;
          }
  EXPECT_EQ(ops::parse_grouped_gemm_config("pingpong128x128c2x1:n:s8").swizzle, 8);
  // The down projection's kernel: every one named round-trips; the default (by the mean rows per
  // expert) is not named.
  for (int down = 0; down < kernels; ++down) {
    const ops::GroupedGemmConfig c{.kernel = 0, .wgrad = 5, .down_kernel = down};
    const std::string name = ops::grouped_gemm_config_name(c);
    const ops::GroupedGemmConfig back = ops::parse_grouped_gemm_config(name);
    EXPECT_EQ(back.down(1, 1).kernel, down) << name;
    EXPECT_EQ(back.down(1 << 20, 1).kernel, down) << name;
    EXPECT_EQ(back.kernel, 0) << name;
    EXPECT_EQ(back.wgrad, 5) << name;
  }
  // Issue 14's shapes: A (2,048 rows per expert) on ping-pong, B (256) on the forward's kernel.
  EXPECT_EQ(ops::GroupedGemmConfig{}.down(16384 * 8, 64).kernel, 3);
  EXPECT_EQ(ops::GroupedGemmConfig{}.down(8192 * 8, 256).kernel, 0);
  EXPECT_EQ(ops::GroupedGemmConfig{.kernel = 2}.down(8192 * 8, 256).kernel, 2);
  EXPECT_EQ(ops::GroupedGemmConfig{.kernel = 2}.down(1024 * 4, 4).kernel, 3);
  EXPECT_EQ(ops::grouped_gemm_config_name(ops::parse_grouped_gemm_config("coop128x256c2x1")),
            "coop128x256c2x1");
  EXPECT_EQ(ops::grouped_gemm_config_name(
                ops::parse_grouped_gemm_config("coop128x256c2x1:down=pingpong128x128c2x1")),
            "coop128x256c2x1:down=pingpong128x128c2x1");
  EXPECT_EQ(
      ops::parse_grouped_gemm_config("coop128x256c2x1:down=pingpong64x256c2x1").down(1, 1).kernel,
      4);
  const ops::GroupedGemmConfig mixed = ops::parse_grouped_gemm_config(
      "coop128x256c2x1:dw=pingpong128x128c1x1:s2:dx=coop256x128c2x1");
  EXPECT_EQ(mixed.kernel, 0);
  EXPECT_EQ(mixed.dx_kernel, 2);
  EXPECT_EQ(mixed.wgrad, 2);
  EXPECT_EQ(mixed.swizzle, 2);
  EXPECT_EQ(ops::grouped_gemm_config_name(
                ops::parse_grouped_gemm_config("coop128x256c2x1:dw=coop128x256c2x1")),
            "coop128x256c2x1");
  // SwiGLU in the epilogues: both, or either alone, round-trip.
  for (const auto& [fwd, bwd] : std::vector<std::pair<bool, bool>>{
           {true, true}, {true, false}, {false, true}, {false, false}}) {
    const ops::GroupedGemmConfig c{.kernel = 3, .swiglu_fwd = fwd, .swiglu_bwd = bwd};
    const std::string name = ops::grouped_gemm_config_name(c);
    const ops::GroupedGemmConfig back = ops::parse_grouped_gemm_config(name);
    EXPECT_EQ(back.swiglu_fwd, fwd) << name;
    EXPECT_EQ(back.swiglu_bwd, bwd) << name;
    EXPECT_EQ(back.kernel, 3) << name;
  }
  EXPECT_TRUE(ops::parse_grouped_gemm_config("coop128x256c2x1:swiglu:narrow").swiglu_narrow);
  EXPECT_EQ(ops::grouped_gemm_config_name(
                ops::parse_grouped_gemm_config("coop128x256c2x1:narrow:swiglu=bwd")),
            ops::grouped_gemm_config_name(
                {.swiglu_fwd = false, .swiglu_bwd = true, .swiglu_narrow = true}));
  EXPECT_EQ(ops::grouped_gemm_config_name(
                ops::parse_grouped_gemm_config("coop128x256c2x1:swiglu=fwd:swiglu=bwd")),
            ops::grouped_gemm_config_name({.swiglu_fwd = false, .swiglu_bwd = true}));
  const ops::GroupedGemmConfig off = ops::parse_grouped_gemm_config("coop128x256c2x1:swiglu=off");
  EXPECT_FALSE(off.swiglu_fwd || off.swiglu_bwd);
  for (const char* bad :
       {"", "coop", "coop128x256c2x1:s3", "coop128x256c2x1:swiglu=", "coop128x256c2x1:swiglu=up",
        "coop128x256c2x1:", "x:n", "coop128x256c2x1:dx=", "coop128x256c2x1:dw=pingpong64x256c2x1",
        "coop128x256c2x1:dx=wgrad", "coop128x256c2x1:dw", "coop128x256c2x1:down=coop128x256c2x1e16",
        "coop128x256c2x1:down="})
    EXPECT_THROW(ops::parse_grouped_gemm_config(bad), ValueError) << bad;
}

// Every compiled kernel configuration of the forward forms and of the weight gradient, an
// input-gradient kernel apart from the forward's, the FFN's down projection forward on the
// cooperative and ping-pong kernels (its default picks one by the rows per expert), and swizzle /
// raster variants, through the tests' own choice (not MOETRAIN_GROUPED_GEMM), so one gpu_suite run
// checks them all.
std::vector<ops::GroupedGemmConfig> all_gemm_configs() {
  std::vector<ops::GroupedGemmConfig> all;
  for (int k = 0; k < static_cast<int>(std::size(ops::kGroupedGemmKernels)); ++k)
    all.push_back({.kernel = k});
  for (int w = 1; w < static_cast<int>(std::size(ops::kGroupedWgradKernels)); ++w)
    all.push_back({.kernel = w % 2 ? 0 : 3, .wgrad = w});
  all.push_back({.kernel = 0, .dx_kernel = 3, .wgrad = 1});
  all.push_back({.kernel = 0, .swizzle = 4, .along_n = true});
  all.push_back({.kernel = 3, .wgrad = 2, .swizzle = 2});
  all.push_back({.kernel = 0, .down_kernel = 0});  // the FFN's down projection cooperative
  all.push_back({.kernel = 0, .down_kernel = 3});  // and ping-pong, whatever the rows per expert
  // SwiGLU in the GEMMs' epilogues (ops/cuda/cutlass/grouped_gemm_sm90_swiglu.h): both, with the
  // gate half on the default kernel and on ping-pong; each alone.
  all.push_back({.kernel = 0, .swiglu_fwd = true, .swiglu_bwd = true});
  all.push_back({.kernel = 3, .swizzle = 2, .swiglu_fwd = true, .swiglu_bwd = true});
  all.push_back({.kernel = 0, .swiglu_fwd = true, .swiglu_bwd = false});
  all.push_back({.kernel = 0, .swiglu_fwd = false, .swiglu_bwd = true});
  all.push_back({.kernel = 0, .swiglu_fwd = false, .swiglu_bwd = false});  // the separate passes
  return all;
}

// The three bf16 forms on CUTLASS (the weight gradient into f32 dW included) under each
// configuration: a hot group, one-row groups and empty ones, partial tiles in every dimension
// (n 200 and 264 against tiles of 128 and 256; k 136), alpha and beta.
TEST(CudaGroupedGemmConfig, EveryConfigurationEveryFormSkewedGroups) {
  REQUIRE_GPU();
  for (const ops::GroupedGemmConfig& cfg : all_gemm_configs()) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t G = 12, in = 136, out = 200;
    Tensor off = Tensor::empty({G + 1}, DType::I32);
    off.i32()[0] = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t n = g == 0 ? 700 : g % 4 == 1 ? 0 : g % 4 == 2 ? 1 : rng.below(90);
      off.i32()[g + 1] = off.i32()[g] + static_cast<int32_t>(n);
    }
    const int64_t N = off.i32()[G];
    std::vector<In> ins = {{randn(rng, {N, in})},  {randn(rng, {G, out, in})},
                           {randn(rng, {N, out})}, {randn(rng, {N, out})},
                           {randn(rng, {N, in})},  {randn(rng, {G, out, in}), false}};
    const std::string name = "grouped_matmul " + ops::grouped_gemm_config_name(cfg);
    run_case(
        name.c_str(), ins, {"xwt", "dyw", "dytx", "dytx written"},
        [&](Context& c, const std::vector<Tensor>& in_, bool gpu) -> std::vector<Tensor> {
          Tensor y = like(c, in_[3]), dx = like(c, in_[4]), dw = like(c, in_[5]);
          OP(grouped_matmul)
          (c, {.form = ops::GroupedForm::XWt, .alpha = 0.7f, .beta = 0.3f, .gemm = cfg}, in_[0],
           off, in_[1], y);
          OP(grouped_matmul)
          (c, {.form = ops::GroupedForm::DyW, .alpha = -1.2f, .beta = 0.f, .gemm = cfg}, in_[2],
           off, in_[1], dx);
          OP(grouped_matmul)
          (c, {.form = ops::GroupedForm::DytX, .alpha = 0.9f, .beta = 1.f, .gemm = cfg}, in_[2],
           off, in_[0], dw);
          // The weight gradient written (beta 0: dW not read; empty groups zeroed).
          Tensor dw0 = like(c, in_[5]);
          OP(grouped_matmul)
          (c, {.form = ops::GroupedForm::DytX, .alpha = 1.1f, .beta = 0.f, .gemm = cfg}, in_[3],
           off, in_[4], dw0);
          return {y, dx, dw, dw0};
        },
        seed, 700);
  }
}

// The experts under each configuration, skewed (a hot expert, one-row and empty experts), with
// the base training and frozen, and LoRA of ranks 8, 16 and 32 on the skinny kernels.
TEST(CudaGroupedGemmConfig, EveryConfigurationExpertsSkewedWithLora) {
  REQUIRE_GPU();
  for (const ops::GroupedGemmConfig& cfg : all_gemm_configs()) {
    const std::string name = ops::grouped_gemm_config_name(cfg);
    FfnSetup s{.rows = 2000, .experts = 16, .in = 264, .ffn = 136, .skewed = true, .gemm = cfg};
    ffn_check(("grouped_ffn full " + name).c_str(), s);
    for (int64_t r : {8, 16, 32}) {
      s.rank = r;
      s.frozen_base = r == 16;
      ffn_check(cat("grouped_ffn lora r", r, s.frozen_base ? " frozen " : " ", name).c_str(), s);
    }
  }
}

// SwiGLU in the GEMMs' epilogues (GroupedGemmConfig::swiglu_fwd / swiglu_bwd) on the base path,
// against the bf16 emulation of the separate passes: the base training (backward forms h for
// dW_down), frozen (no h), h kept from forward; skewed counts (a hot expert over many tiles,
// one-row and empty experts), F a whole tile (256), partial tiles (F 136, 200; rows of every
// residue), and sizes the kernels refuse (in 19, F 23: the separate passes run).
TEST(CudaGroupedFfn, SwigluInTheGemmEpilogues) {
  REQUIRE_GPU();
  const ops::GroupedGemmConfig both = ops::parse_grouped_gemm_config("coop128x256c2x1:swiglu");
  ffn_check("grouped_ffn fused swiglu, full, 4096 rows skewed",
            {.rows = 4096, .experts = 16, .in = 256, .ffn = 256, .skewed = true, .gemm = both});
  ffn_check("grouped_ffn fused swiglu, frozen, 4096 rows skewed", {.rows = 4096,
                                                                   .experts = 16,
                                                                   .in = 256,
                                                                   .ffn = 256,
                                                                   .frozen_base = true,
                                                                   .skewed = true,
                                                                   .gemm = both});
  ffn_check("grouped_ffn fused swiglu, h kept, F 136",
            {.rows = 3000, .experts = 9, .in = 264, .ffn = 136, .gemm = both, .keep_h = true});
  ffn_check("grouped_ffn fused swiglu, 64 experts, F 200",
            {.rows = 5000, .experts = 64, .in = 128, .ffn = 200, .gemm = both});
  ffn_check("grouped_ffn fused swiglu, dW written, gate half on ping-pong",
            {.rows = 2000,
             .experts = 8,
             .in = 512,
             .ffn = 128,
             .skewed = true,
             .gemm = ops::parse_grouped_gemm_config("pingpong128x128c2x1:swiglu"),
             .weight_grads_zero = true});
  ffn_check("grouped_ffn fused swiglu refused, odd sizes",
            {.rows = 53, .experts = 5, .in = 19, .ffn = 23, .gemm = both});
}

// The interleaved gate/up layout (GroupedFfnParams::interleaved_gate_up) through the op: one GEMM
// whose epilogue writes gate_up and h in the bf16 pass (UpInterleaved), the plain GEMM and the
// element-wise SwiGLU over blocks of 16 in the f32 pass, SwiGLU's backward over them in both;
// against the emulation's SwiGLU over the same blocks. Skewed counts (a hot expert over many
// tiles, one-row and empty experts), 2F a whole number of tiles (F 256) and not (F 144, 208);
// adapters on the separate passes and on the K-concatenation path.
TEST(CudaGroupedFfn, InterleavedGateUpThroughTheOp) {
  REQUIRE_GPU();
  ffn_check(
      "grouped_ffn interleaved, full, 4096 rows skewed",
      {.rows = 4096, .experts = 16, .in = 256, .ffn = 256, .skewed = true, .interleaved = true});
  ffn_check("grouped_ffn interleaved, frozen, F 208", {.rows = 3000,
                                                       .experts = 9,
                                                       .in = 264,
                                                       .ffn = 208,
                                                       .frozen_base = true,
                                                       .interleaved = true});
  ffn_check("grouped_ffn interleaved, h kept, dW written, F 144", {.rows = 2500,
                                                                   .experts = 64,
                                                                   .in = 128,
                                                                   .ffn = 144,
                                                                   .weight_grads_zero = true,
                                                                   .keep_h = true,
                                                                   .interleaved = true});
  // With an adapter: the separate passes (rank 3, odd widths), and the K-concatenation path (its
  // fused xa and dr GEMMs, the SwiGLU passes in their composite forms).
  ffn_check("grouped_ffn interleaved, lora r3",
            {.rows = 41, .experts = 7, .in = 19, .ffn = 32, .rank = 3, .interleaved = true});
  ffn_check("grouped_ffn interleaved, kconcat lora r16 frozen", {.rows = 3000,
                                                                 .experts = 16,
                                                                 .in = 256,
                                                                 .ffn = 144,
                                                                 .rank = 16,
                                                                 .frozen_base = true,
                                                                 .kconcat = true,
                                                                 .pad_rows = true,
                                                                 .interleaved = true});
}

// The fused projections called directly: taken in the bf16 pass (the bodies say whether they ran;
// the f32 pass runs the separate passes on the GPU), against the CPU's grouped_matmul and SwiGLU
// with gate_up and dh rounded to bf16 where the fused kernels round them; each fused kernel
// (cooperative, ping-pong, the backward on ping-pong alone), a hot group over many tiles, one-row
// and empty groups, partial tiles in n (F 200) and k (in 264).
TEST(CudaGroupedFfn, FusedSwigluProjectionsAgainstTheSeparatePasses) {
  REQUIRE_GPU();
  for (const char* cfg_name :
       {"coop128x256c2x1:swiglu", "pingpong128x128c2x1:swiglu",
        "coop128x256c2x1:dx=pingpong128x128c2x1:swiglu=bwd", "coop128x256c2x1:swiglu:narrow",
        "pingpong128x128c2x1:swiglu:narrow"}) {
    const ops::GroupedGemmConfig cfg = ops::parse_grouped_gemm_config(cfg_name);
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t G = 12, in = 264, F = 200;
    Tensor off = Tensor::empty({G + 1}, DType::I32);
    off.i32()[0] = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t n = g == 0 ? 700 : g % 4 == 1 ? 0 : g % 4 == 2 ? 1 : rng.below(90);
      off.i32()[g + 1] = off.i32()[g] + static_cast<int32_t>(n);
    }
    const int64_t N = off.i32()[G];
    const ops::GroupedFfnParams p{.rows = N, .experts = G, .in = in, .ffn = F, .gemm = cfg};
    const std::vector<In> ins = {{randn(rng, {N, in})},
                                 {randn(rng, {G, 2 * F, in}, 0.1)},
                                 {randn(rng, {N, in})},
                                 {randn(rng, {G, in, F}, 0.1)},
                                 {randn(rng, {N, 2 * F}, 2.0)}};
    const auto run = [&](bool emulate) {
      return [&, emulate](Context& c, const std::vector<Tensor>& v,
                          bool gpu) -> std::vector<Tensor> {
        const DType dt = v[0].dtype();
        Tensor gate_up = out(c, {N, 2 * F}, dt), h = out(c, {N, F}, dt),
               dgu = out(c, {N, 2 * F}, dt), hb = out(c, {N, F}, dt);
        const auto store = [&](Tensor& t) {
          if (emulate) t.copy_from(round_bf16(t));
        };
        bool fwd = false, bwd = false;
        if (gpu) {
          fwd = ops::cuda::grouped_ffn_gate_up_swiglu(c, p, v[0], off, v[1], gate_up, h);
          bwd = ops::cuda::grouped_ffn_down_swiglu_backward(c, p, v[2], off, v[3], v[4], dgu, hb);
          EXPECT_EQ(fwd, dt == DType::BF16 && cfg.swiglu_fwd) << cfg_name << " forward taken";
          EXPECT_EQ(bwd, dt == DType::BF16) << cfg_name << " backward taken";
        }
        if (!fwd) {
          ops::grouped_matmul(c, {.form = ops::GroupedForm::XWt, .gemm = cfg}, v[0], off, v[1],
                              gate_up);
          store(gate_up);
          (gpu ? ops::cuda::grouped_ffn_swiglu_forward : ops::cpu::grouped_ffn_swiglu_forward)(
              c, gate_up, h, F);
        }
        if (!bwd) {
          Tensor dh = out(c, {N, F}, dt);
          ops::grouped_matmul(c, {.form = ops::GroupedForm::DyW, .gemm = cfg}, v[2], off, v[3], dh);
          store(dh);
          (gpu ? ops::cuda::grouped_ffn_swiglu_backward_with_h
               : ops::cpu::grouped_ffn_swiglu_backward_with_h)(c, v[4], dh, dgu, hb, F);
        }
        return {gate_up, h, dgu, hb};
      };
    };
    run_case(cat("fused swiglu projections ", cfg_name).c_str(), ins,
             {"gate_up", "h", "dgate_up", "h (backward)"}, run(false), seed, in, run(true));
  }
}

// Host offsets [G + 1] of the fused K-concatenation GEMMs' tests: a hot expert over many row tiles
// (900 rows), every fourth expert from the second empty, from the third one row, the rest random.
Tensor hot_one_row_and_empty_offsets(Rng& rng, int64_t G) {
  Tensor off = Tensor::empty({G + 1}, DType::I32);
  off.i32()[0] = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t n = g == 0 ? 900 : g % 4 == 1 ? 0 : g % 4 == 2 ? 1 : rng.below(200);
    off.i32()[g + 1] = off.i32()[g] + static_cast<int32_t>(n);
  }
  return off;
}

// The interleaved fused forward called directly: taken for bf16 (and only for bf16), gate_up and h
// against the CPU's grouped_matmul and its SwiGLU over blocks of 16 on gate_up rounded to bf16, as
// the kernel forms h from the values it stores. Rows of every residue (a hot group over many
// tiles, one-row and empty groups), 2F over whole and partial tiles, `in` a partial k-tile.
TEST(CudaGroupedFfn, InterleavedSwigluEpilogueAgainstTheCpu) {
  REQUIRE_GPU();
  for (const int64_t F : {int64_t{128}, int64_t{208}}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t G = 12, in = 264;
    const Tensor off = hot_one_row_and_empty_offsets(rng, G);
    const int64_t N = off.i32()[G];
    const ops::GroupedFfnParams p{
        .rows = N, .experts = G, .in = in, .ffn = F, .interleaved_gate_up = true};
    const std::vector<In> ins = {{randn(rng, {N, in})}, {randn(rng, {G, 2 * F, in}, 0.1)}};
    // emulate: gate_up rounded to bf16 before SwiGLU reads it, as the kernel forms h.
    const auto run = [&](bool emulate) {
      return
          [&, emulate](Context& c, const std::vector<Tensor>& v, bool gpu) -> std::vector<Tensor> {
            const DType dt = v[0].dtype();
            Tensor gate_up = out(c, {N, 2 * F}, dt), h = out(c, {N, F}, dt);
            bool fused = false;
            if (gpu) {
              fused = ops::cuda::grouped_ffn_gate_up_swiglu(c, p, v[0], off, v[1], gate_up, h);
              EXPECT_EQ(fused, dt == DType::BF16) << "F " << F << ": the fused kernel taken";
            }
            if (!fused) {
              ops::grouped_matmul(c, {.form = ops::GroupedForm::XWt}, v[0], off, v[1], gate_up);
              if (emulate) gate_up.copy_from(round_bf16(gate_up));
              (gpu ? ops::cuda::grouped_ffn_swiglu_forward : ops::cpu::grouped_ffn_swiglu_forward)(
                  c, gate_up, h, ops::kGateUpInterleave);
            }
            return {gate_up, h};
          };
    };
    run_case(cat("interleaved swiglu epilogue F ", F).c_str(), ins, {"gate_up", "h"}, run(false),
             seed, in, run(true));
  }
}

// The K-concatenation forward's gate/up GEMM with xa = X A^T formed in its mainloop (ops/cuda/
// grouped_matmul.h, grouped_gate_up_lora_xa): gate_up = X W^T + bf16(X A^T) (s B)^T, and xa into
// X's padding columns, against the CPU's two grouped products (xa, then [X | xa] times the padded
// buffer's rows). X's padding starts as NaN (the GEMM must not read it: its last k-tile multiplies
// the registers' xa instead); a hot expert over many row tiles, one-row
// and empty experts, a partial n-tile (2F = 272 against 256-wide tiles), `in` of 4 and of 1
// k-tiles; 160 experts (more row tiles than the persistent grid's CTAs, so that CTAs wait on
// n-block-0 tiles of other waves). The bf16 pass must take the fused kernel (the f32 pass runs the
// two products on the GPU).
TEST(CudaGroupedFfn, GateUpGemmFormsXaInItsMainloop) {
  REQUIRE_GPU();
  for (const auto& [in, G] : {std::pair<int64_t, int64_t>{256, 10}, {64, 10}, {64, 160}}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t F = 136, r = 16;
    const Tensor off = hot_one_row_and_empty_offsets(rng, G);
    const int64_t N = off.i32()[G];
    // The padded buffer [[W, s B], [A, corner]], and for the reference its [W, s B] rows and its A
    // block as contiguous copies (the CPU's grouped_matmul reads contiguous weights).
    const Tensor pbuf = randn(rng, {G, 2 * F + r, in + r}, 0.1);
    Tensor w_full = Tensor::empty({G, 2 * F, in + r}), a_gu = Tensor::empty({G, r, in});
    w_full.copy_from(pbuf.narrow(1, 0, 2 * F));
    a_gu.copy_from(pbuf.narrow(1, 2 * F, 2 * F + r).narrow(2, 0, in));
    const std::vector<In> ins = {{randn(rng, {N, in})}, {pbuf}, {w_full}, {a_gu}};
    const auto run = [&](bool emulate) {
      return [&, emulate](Context& c, const std::vector<Tensor>& v,
                          bool gpu) -> std::vector<Tensor> {
        const DType dt = v[0].dtype();
        // X in a NaN-padded [N, in + r] view.
        Tensor xbuf = out(c, {N, ops::grouped_ffn_row_pitch(in, r)}, dt);
        Tensor xp = xbuf.cols(0, in + r), head = xp.cols(0, in);
        ops::copy(c, v[0], head);
        Tensor gate_up = out(c, {N, 2 * F}, dt);
        bool fused = false;
        if (gpu) {
          fused =
              ops::cuda::grouped_gate_up_lora_xa(c, xp, off, v[1].narrow(1, 0, 2 * F), r, gate_up);
          EXPECT_EQ(fused, dt == DType::BF16)
              << "in " << in << ", " << G << " experts: the fused GEMM taken";
        }
        if (!fused) {
          Tensor xa = out(c, {N, r}, dt), xa_at = xp.cols(in, in + r);
          ops::grouped_matmul(c, {.form = ops::GroupedForm::XWt}, head, off, v[3], xa);
          if (emulate) xa.copy_from(round_bf16(xa));  // the GPU's bf16 xa operand
          ops::copy(c, xa, xa_at);
          ops::grouped_matmul(c, {.form = ops::GroupedForm::XWt}, xp, off, v[2], gate_up);
        }
        Tensor xa = out(c, {N, r}, dt);
        ops::copy(c, xp.cols(in, in + r), xa);
        return {gate_up, xa};
      };
    };
    run_case(cat("gate/up with xa in the mainloop, in ", in, ", ", G, " experts").c_str(), ins,
             {"gate_up", "xa"}, run(false), seed, in + r, run(true));
  }
}

// The K-concatenation backward's down dX GEMM with dr = dY (s B) and dB += s dY^T ha formed in its
// mainloop (ops/cuda/grouped_matmul.h, grouped_dx_lora_dr): dh = dY W + bf16(dr) A, dr into
// dY's padding, dB added into its pre-filled values, against the CPU's products (dr, then [dY | dr]
// times the padded buffer's columns, and dY^T ha). dY's padding starts as NaN; a hot expert over
// many row tiles, one-row and empty experts; `out` of 4 and 1 k-tile pairs, 6 and 3 (the row
// block's k-tile pairs shared among F / 256 = 1, 2 or 3 n-blocks, unevenly at 1 pair for 2, and
// partial n-tiles at F = 272 and 520); 160 experts at F = 272 (more row tiles than the persistent
// grid's CTAs; at 3 n-blocks their one-tile groups fail sm90_lora_dr_pays). The bf16 pass must take
// the fused kernel (the f32 pass runs the products on the GPU).
TEST(CudaGroupedFfn, DownDxGemmFormsDrAndDbInItsMainloop) {
  REQUIRE_GPU();
  for (const auto& [out_dim, F, G] : {std::tuple<int64_t, int64_t, int64_t>{512, 136, 10},
                                      {128, 272, 10},
                                      {768, 272, 10},
                                      {384, 520, 10},
                                      {128, 272, 160}}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t r = 16;
    const float s = 2.f;  // dB's scale (the buffer holds s B already)
    const Tensor off = hot_one_row_and_empty_offsets(rng, G);
    const int64_t N = off.i32()[G];
    // The padded buffer [[W, s B], [A, corner]] [G, out + r, F + r]; for the reference its s B
    // columns as a contiguous [G, out, r] copy.
    const Tensor pbuf = randn(rng, {G, out_dim + r, F + r}, 0.1);
    Tensor sb = Tensor::empty({G, out_dim, r}), w_dx = Tensor::empty({G, out_dim + r, F});
    sb.copy_from(pbuf.narrow(1, 0, out_dim).narrow(2, F, F + r));
    w_dx.copy_from(pbuf.narrow(2, 0, F));
    const std::vector<In> ins = {{randn(rng, {N, out_dim})},
                                 {pbuf},
                                 {sb},
                                 {w_dx},
                                 {randn(rng, {N, r})},
                                 {randn(rng, {G, out_dim, r}, 1e-2), false}};
    const auto run = [&](bool emulate) {
      return [&, emulate](Context& c, const std::vector<Tensor>& v,
                          bool gpu) -> std::vector<Tensor> {
        const DType dt = v[0].dtype();
        Tensor ybuf = out(c, {N, ops::grouped_ffn_row_pitch(out_dim, r)}, dt);
        Tensor dyp = ybuf.cols(0, out_dim + r), head = dyp.cols(0, out_dim);
        ops::copy(c, v[0], head);
        Tensor dh = out(c, {N, F}, dt), db = like(c, v[5]);
        bool fused = false;
        if (gpu) {
          fused =
              ops::cuda::grouped_dx_lora_dr(c, dyp, off, v[1].narrow(2, 0, F), r, v[4], s, db, dh);
          EXPECT_EQ(fused, dt == DType::BF16)
              << "out " << out_dim << ", F " << F << ", " << G << " experts: the fused GEMM taken";
        }
        if (!fused) {
          Tensor dr = out(c, {N, r}, dt), dr_at = dyp.cols(out_dim, out_dim + r);
          ops::grouped_matmul(c, {.form = ops::GroupedForm::DyW}, head, off, v[2], dr);
          if (emulate) dr.copy_from(round_bf16(dr));  // the GPU's bf16 dr operand
          ops::copy(c, dr, dr_at);
          ops::grouped_matmul(c, {.form = ops::GroupedForm::DyW}, dyp, off, v[3], dh);
          ops::grouped_matmul(c, {.form = ops::GroupedForm::DytX, .alpha = s, .beta = 1.f}, head,
                              off, v[4], db);
        }
        Tensor dr = out(c, {N, r}, dt);
        ops::copy(c, dyp.cols(out_dim, out_dim + r), dr);
        return {dh, dr, db};
      };
    };
    run_case(
        cat("down dX with dr and dB in the mainloop, out ", out_dim, ", F ", F, ", ", G, " experts")
            .c_str(),
        ins, {"dh", "dr", "db"}, run(false), seed, std::max<int64_t>(out_dim + r, 900), run(true));
  }
}

// The LoRA backward's one pass over dOut (ops/cuda/lora_grouped.h: dr and dB together) at ranks
// 8 and 16 (blocks of four 128-row parts), a multiple of 8 but not of 16 (the padded half pair)
// and its widest rank, 32 (two parts), with K of several stages and a partial one (in 2056 = 32 x
// 64 + 8), a hot expert over many blocks whose last has a partial part, one-row and empty
// experts; and session 13's one-part blocks at rank 16.
TEST(CudaGroupedFfn, LoraBackwardOnePassOverDout) {
  REQUIRE_GPU();
  for (int64_t r : {8, 16, 24, 32})
    ffn_check(cat("grouped_ffn lora out grads r", r).c_str(),
              {.rows = 3000, .experts = 8, .in = 2056, .ffn = 72, .rank = r, .skewed = true});
  ffn_check(
      "grouped_ffn lora out grads r16, session 13's kernels",
      {.rows = 3000, .experts = 8, .in = 2056, .ffn = 72, .rank = 16, .skewed = true, .s13 = true});
  // dr's fragments in registers, dB from the shared tile (LoraKernels::Registers: 128-row blocks,
  // 64-column chunks, the last partial at in = 520 and ffn = 72; rank 24 padded to two m-tiles),
  // and the two separate products. Rank 8 fills half an n-tile, a case no other test reaches.
  for (int64_t r : {8, 16, 24})
    ffn_check(cat("grouped_ffn lora out grads r", r, ", registers").c_str(),
              {.rows = 3000,
               .experts = 8,
               .in = 520,
               .ffn = 72,
               .rank = r,
               .skewed = true,
               .lora_og = ops::LoraKernels::Registers});
  ffn_check("grouped_ffn lora out grads r16, separate products",
            {.rows = 3000,
             .experts = 8,
             .in = 520,
             .ffn = 72,
             .rank = 16,
             .skewed = true,
             .lora_og = ops::LoraKernels::Separate});
}

// A deterministic context runs the experts (base and LoRA training) bit for bit the same twice,
// under each configuration: no split-k, no atomics on its path.
TEST(CudaGroupedGemmConfig, DeterministicExpertsRepeatBitwise) {
  REQUIRE_GPU();
  for (const ops::GroupedGemmConfig& cfg : all_gemm_configs()) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(cat(ops::grouped_gemm_config_name(cfg), " seed=", seed, " (", seed_note(), ")"));
    Rng rng(seed);
    const FfnSetup s{.rows = 3000,
                     .experts = 16,
                     .in = 264,
                     .ffn = 136,
                     .rank = 16,
                     .skewed = true,
                     .gemm = cfg};
    const FfnCase k = ffn_case(s, rng);
    Context c(ContextOptions{.device = Device::CUDA, .seed = seed, .deterministic = true});
    std::vector<Tensor> in;
    for (const In& i : k.ins) {
      Tensor d = Tensor::empty(i.host.shape(), i.lowp ? DType::BF16 : DType::F32, Device::CUDA);
      d.copy_from(i.host);
      in.push_back(d);
    }
    const auto run = [&] {
      std::vector<std::vector<uint8_t>> bytes;
      for (const Tensor& t : ffn_op(c, s, k, in)) {
        c.synchronize();
        bytes.push_back(host_bytes(t));
      }
      return bytes;
    };
    const auto first = run(), second = run();
    ASSERT_EQ(first.size(), k.names.size());
    for (size_t j = 0; j < first.size(); ++j)
      EXPECT_EQ(first[j], second[j]) << k.names[j] << " differs between two deterministic runs";
  }
}

}  // namespace
}  // namespace mt::test
