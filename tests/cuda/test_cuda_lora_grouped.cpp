// The skinny grouped products of expert LoRA (ops/cuda/lora_grouped.h) against the CPU
// grouped_matmul, through harness/gpu_check.h: the bf16 pass runs the skinny kernels (the f32
// pass goes to cuBLAS, the kernels take bf16 only). Groups are empty, of one row, and skewed (one
// holds most rows, so the weight gradient splits it over several blocks); widths leave partial
// tiles (K = 136 against stages of 64, n = 200 against column tiles of 128). Ranks 8 to 64 take
// each accumulator width the kernels are built for (one, two and four n-tile pairs; 48 the four
// with one unused). Without a GPU the checks skip, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "harness/gpu_check.h"
#include "harness/seed.h"
#include "ops/grouped_ffn.h"
#include "ops/grouped_matmul.h"

namespace mt::test {
namespace {

constexpr auto XWt = ops::GroupedForm::XWt, DyW = ops::GroupedForm::DyW,
               DytX = ops::GroupedForm::DytX;

// Offsets of G groups: group 0 and G-1 empty, group 1 one row, group 2 `heavy` rows, the rest
// 0..40 rows at random.
Tensor skewed_offsets(Rng& rng, int64_t G, int32_t heavy) {
  Tensor off = Tensor::empty({G + 1}, DType::I32);
  off.i32()[0] = 0;
  for (int64_t g = 0; g < G; ++g) {
    int32_t n = static_cast<int32_t>(rng.below(41));
    if (g == 0 || g == G - 1) n = 0;
    if (g == 1) n = 1;
    if (g == 2) n = heavy;
    off.i32()[g + 1] = off.i32()[g] + n;
  }
  return off;
}

// Every skinny product: down (XWt with W [G, r, K], DyW with W [G, K, r]), up (XWt with
// W [G, n, r] and beta, DyW with W [G, r, n]) and both weight-gradient layouts (dW [G, r, K] from
// A = the rank-wide rows, dW [G, n, r] from B = them), with alpha and beta.
TEST(CudaLoraGrouped, SkinnyProductsAgainstCpu) {
  REQUIRE_GPU();
  for (const int64_t r : {8, 16, 32, 48, 64}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t G = 12, K = 136, n = 200;
    const int32_t heavy = 1500;
    const Tensor off = skewed_offsets(rng, G, heavy);
    const int64_t N = off.i32()[G];
    const std::vector<In> ins = {{randn(rng, {N, K})},           {randn(rng, {G, r, K})},
                                 {randn(rng, {G, n, r})},        {randn(rng, {G, K, r})},
                                 {randn(rng, {G, r, n})},        {randn(rng, {N, r})},
                                 {randn(rng, {N, n})},           {randn(rng, {N, n})},
                                 {randn(rng, {G, r, K}), false}, {randn(rng, {G, n, r}), false}};
    const std::string name = "skinny grouped r=" + std::to_string(r);
    run_case(
        name.c_str(), ins, {"down_xwt", "down_dyw", "up_xwt", "up_dyw", "dw_rk", "dw_nr"},
        [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
          const DType at = in[0].dtype();
          Tensor down1 = out(c, {N, r}, at), down2 = out(c, {N, r}, at), up1 = like(c, in[7]),
                 up2 = out(c, {N, n}, at), dw1 = like(c, in[8]), dw2 = like(c, in[9]);
          OP(grouped_matmul)(c, {.form = XWt, .alpha = 0.7f}, in[0], off, in[1], down1);
          OP(grouped_matmul)(c, {.form = DyW, .alpha = -1.3f}, in[0], off, in[3], down2);
          OP(grouped_matmul)
          (c, {.form = XWt, .alpha = 0.5f, .beta = 0.75f}, in[5], off, in[2], up1);
          OP(grouped_matmul)(c, {.form = DyW, .alpha = 2.f}, in[5], off, in[4], up2);
          OP(grouped_matmul)
          (c, {.form = DytX, .alpha = 0.9f, .beta = 0.5f}, in[5], off, in[0], dw1);
          OP(grouped_matmul)
          (c, {.form = DytX, .alpha = 1.1f, .beta = 1.f}, in[6], off, in[5], dw2);
          return {down1, down2, up1, up2, dw1, dw2};
        },
        seed, std::max<int64_t>(heavy, K));
  }
}

// A deterministic context sums each group's rows in one block, in row order: two runs of every
// skinny product from the same inputs and pre-filled gradients agree bit for bit.
TEST(CudaLoraGrouped, DeterministicModeRepeatsBitwise) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed, " (", seed_note(), ")"));
  Rng rng(seed);
  const int64_t G = 6, K = 264, n = 128, r = 16;
  const Tensor off = skewed_offsets(rng, G, 5000);
  const int64_t N = off.i32()[G];
  Context c(ContextOptions{.device = Device::CUDA, .seed = seed, .deterministic = true});
  const auto dev = [&](const Tensor& host, DType dt) {
    Tensor d = Tensor::empty(host.shape(), dt, Device::CUDA);
    d.copy_from(host);
    return d;
  };
  const Tensor x = dev(randn(rng, {N, K}), DType::BF16), s = dev(randn(rng, {N, r}), DType::BF16),
               dy = dev(randn(rng, {N, n}), DType::BF16),
               a = dev(randn(rng, {G, r, K}), DType::BF16),
               b = dev(randn(rng, {G, n, r}), DType::BF16);
  const Tensor ga0 = randn(rng, {G, r, K}), gb0 = randn(rng, {G, n, r});
  const auto run = [&]() -> std::vector<Tensor> {
    Tensor xa = out(c, {N, r}, DType::BF16), y = out(c, {N, n}, DType::BF16),
           ga = dev(ga0, DType::F32), gb = dev(gb0, DType::F32);
    ops::grouped_matmul(c, {.form = XWt}, x, off, a, xa);
    ops::grouped_matmul(c, {.form = XWt, .alpha = 2.f}, s, off, b, y);
    ops::grouped_matmul(c, {.form = DytX, .beta = 1.f}, s, off, x, ga);
    ops::grouped_matmul(c, {.form = DytX, .alpha = 2.f, .beta = 1.f}, dy, off, s, gb);
    std::vector<Tensor> res;
    for (const Tensor& t : {xa, y, ga, gb}) {
      Tensor h = Tensor::empty(t.shape());
      c.synchronize();
      h.copy_from(t);
      res.push_back(h);
    }
    return res;
  };
  const std::vector<Tensor> first = run(), second = run();
  const char* names[] = {"xa", "y", "dA", "dB"};
  for (size_t j = 0; j < first.size(); ++j)
    EXPECT_EQ(std::memcmp(first[j].f32(), second[j].f32(),
                          static_cast<size_t>(first[j].numel()) * sizeof(float)),
              0)
        << names[j] << " differs between two deterministic runs";
}

// bf16 bits to float, and a float rounded to bf16 (to nearest even; the inputs hold no NaN): the
// host loops' reference for the packing kernel.
float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// grouped_ffn_lora_pack's kernel (one launch for both projections' A and s B) against host loops
// over the padded buffers, element for element: W untouched, A in the rows below W, bf16(s B) in
// the columns right of W (rounded once from the f32 product), the corner left as zeros, at ranks
// 8 and 16 with bf16 and f32 factors. Several experts, widths of one and several 16-byte packs.
TEST(CudaLoraGrouped, PackIntoThePaddedBuffersAgainstHostLoops) {
  REQUIRE_GPU();
  for (const DType ft : {DType::BF16, DType::F32})
    for (const int64_t r : {8, 16}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(
          cat("factors ", dtype_name(ft), " r=", r, " seed=", seed, " (", seed_note(), ")"));
      Rng rng(seed);
      const int64_t E = 5, l = 40, F = 24;
      Context c(ContextOptions{.device = Device::CUDA, .seed = seed});
      const auto dev = [&](const Tensor& h, DType dt) {
        Tensor d = Tensor::empty(h.shape(), dt, Device::CUDA);
        d.copy_from(h);
        return d;
      };
      const Tensor wgu_h = randn(rng, {E, 2 * F, l}), wd_h = randn(rng, {E, l, F});
      const Tensor agu_h = randn(rng, {E, r, l}), bgu_h = randn(rng, {E, 2 * F, r}),
                   ad_h = randn(rng, {E, r, F}), bd_h = randn(rng, {E, l, r});
      ops::GroupedFfnWeights w{.gate_up = ops::grouped_ffn_pad_weight(dev(wgu_h, DType::BF16), r),
                               .down = ops::grouped_ffn_pad_weight(dev(wd_h, DType::BF16), r),
                               .gate_up_a = dev(agu_h, ft),
                               .gate_up_b = dev(bgu_h, ft),
                               .down_a = dev(ad_h, ft),
                               .down_b = dev(bd_h, ft)};
      const float alpha = 7.f + static_cast<float>(rng.below(20));
      const ops::GroupedFfnParams p{
          .rows = 1, .experts = E, .in = l, .ffn = F, .lora_rank = r, .lora_alpha = alpha};
      const float s = p.lora_scale();
      ops::cuda::grouped_ffn_lora_pack(c, p, w);
      c.synchronize();
      // Each factor as the kernel reads it: bf16 factors hold the rounded values.
      const auto as_read = [&](const Tensor& h) { return ft == DType::BF16 ? round_bf16(h) : h; };
      const Tensor agu = as_read(agu_h), bgu = as_read(bgu_h), ad = as_read(ad_h),
                   bd = as_read(bd_h);
      const auto check = [&](const char* what, const Tensor& wblock, const Tensor& w_h,
                             const Tensor& a, const Tensor& b) {
        // The buffer's rows are grouped_ffn_row_pitch(in, r) apart: 128-byte lines.
        const int64_t out = wblock.dim(1), in = wblock.dim(2);
        const int64_t pitch = ops::grouped_ffn_row_pitch(in, r);
        ASSERT_EQ(pitch % 64, 0);
        const Tensor buf(wblock.raw(), {E, out + r, pitch}, DType::BF16, Device::CUDA);
        const std::vector<uint8_t> bytes = host_bytes(buf.clone());
        const Tensor wr = round_bf16(w_h);
        int64_t bad = 0;
        for (int64_t e = 0; e < E; ++e)
          for (int64_t i = 0; i < out + r; ++i)
            for (int64_t j = 0; j < in + r; ++j) {
              uint16_t bits;
              std::memcpy(&bits, &bytes[2 * static_cast<size_t>((e * (out + r) + i) * pitch + j)],
                          2);
              const float got = bf16_bits_to_float(bits);
              float want = 0.f;
              if (i < out && j < in)
                want = wr.f32()[(e * out + i) * in + j];
              else if (i >= out && j < in)
                want = round_to_bf16(a.f32()[(e * r + i - out) * in + j]);
              else if (i < out)
                want = round_to_bf16(s * b.f32()[(e * out + i) * r + j - in]);
              if (got != want && ++bad <= 5)
                ADD_FAILURE() << what << " expert " << e << " (" << i << ", " << j << "): " << got
                              << ", want " << want;
            }
        EXPECT_EQ(bad, 0) << what << ": elements that differ";
      };
      check("gate_up", w.gate_up, wgu_h, agu, bgu);
      check("down", w.down, wd_h, ad, bd);
    }
}

// xa = X A^T on the register kernel (grouped_ffn_lora_xa with LoraKernels::Registers: 16-row tiles
// per warp, 64 columns per step) against the CPU's grouped product: skewed groups (the hot one
// ends in a partial tile; one-row and empty ones), K = 136 (a partial 32-column chunk and a step
// whose second chunk lies past K), every rank width the kernel is built for.
TEST(CudaLoraGrouped, XaRegisterKernelAgainstTheCpu) {
  REQUIRE_GPU();
  for (const int64_t r : {8, 16, 24, 32, 40, 48, 56, 64}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t G = 12, K = 136;
    const Tensor off = skewed_offsets(rng, G, 700);
    const int64_t N = off.i32()[G];
    ops::GroupedFfnParams p{
        .rows = N, .experts = G, .in = K, .ffn = 8, .lora_rank = r, .lora_alpha = 16.f};
    p.lora_xa = ops::LoraKernels::Registers;
    run_case(
        cat("lora xa registers r=", r).c_str(), {{randn(rng, {N, K})}, {randn(rng, {G, r, K})}},
        {"xa"},
        [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
          Tensor xa = out(c, {N, r}, in[0].dtype());
          (gpu ? &ops::cuda::grouped_ffn_lora_xa : &ops::cpu::grouped_ffn_lora_xa)(c, p, in[0], off,
                                                                                   in[1], xa);
          return {xa};
        },
        seed, K);
  }
}

// The K-concatenation path's SwiGLU kernels joined with adapter products (ops/grouped_ffn.h:
// grouped_ffn_lora_swiglu_backward_grads, grouped_ffn_lora_swiglu_ha) against the CPU's composite
// bodies: the bf16 pass runs the fused kernels, and the emulation rounds h and dgate_up to bf16
// where the kernels keep them (in shared memory or registers) before the products read them. Skewed
// groups (a hot one over several 256-row blocks with a partial 64-row part, one-row and empty
// ones), F = 72 (a partial 32-column chunk), ranks of one and two n-tile pairs (and 64 for ha); the
// backward runs a second time without dB and dA (their products skipped) into fresh outputs.
TEST(CudaLoraGrouped, FusedSwigluKernelsAgainstTheCpuComposites) {
  REQUIRE_GPU();
  for (const int64_t r : {8, 16, 24, 32, 64}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t G = 12, F = 72;
    const int32_t heavy = 700;
    const Tensor off = skewed_offsets(rng, G, heavy);
    const int64_t N = off.i32()[G];
    const ops::GroupedFfnParams p{
        .rows = N, .experts = G, .in = 8, .ffn = F, .lora_rank = r, .lora_alpha = 24.f};
    const float s = p.lora_scale();
    const std::vector<In> ha_ins = {{randn(rng, {N, 2 * F})}, {randn(rng, {G, r, F}, 0.2)}};
    // Both one-pass forms of the forward (LoraKernels): staged, and fragments in registers
    // (16-row tiles per warp: the hot group ends in a partial one, F = 72 in a partial chunk).
    for (const auto kernels : {ops::LoraKernels::Staged, ops::LoraKernels::Registers}) {
      ops::GroupedFfnParams pk = p;
      pk.lora_fwd = kernels;
      const bool regs = kernels == ops::LoraKernels::Registers;
      run_case(
          cat("lora swiglu ha r=", r, regs ? " registers" : " staged").c_str(), ha_ins, {"h", "ha"},
          [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
            const DType at = in[0].dtype();
            Tensor h = out(c, {N, F}, at), ha = out(c, {N, r}, at);
            (gpu ? &ops::cuda::grouped_ffn_lora_swiglu_ha : &ops::cpu::grouped_ffn_lora_swiglu_ha)(
                c, pk, in[0], off, in[1], h, ha);
            return {h, ha};
          },
          seed, F,
          [&](Context& c, const std::vector<Tensor>& in, bool) -> std::vector<Tensor> {
            Tensor h = Tensor::empty({N, F}), ha = Tensor::empty({N, r});
            ops::cpu::grouped_ffn_swiglu_forward(c, in[0], h, F);
            h = round_bf16(h);
            ops::grouped_matmul(c, {.form = XWt}, h, off, in[1], ha);
            return {h, ha};
          });
    }
    if (r > 32) continue;  // the backward kernel's widest rank; past it the composite runs
    const std::vector<In> ins = {{randn(rng, {N, 2 * F})},
                                 {randn(rng, {N, F})},
                                 {randn(rng, {N, r})},
                                 {randn(rng, {N, r})},
                                 {randn(rng, {G, 2 * F, r}, 0.2)},
                                 {randn(rng, {G, 2 * F, r}), false},
                                 {randn(rng, {G, r, F}), false}};
    // Both one-pass forms of the backward (LoraKernels): staged, and fragments in registers
    // (128-row blocks: the hot group ends in a partial one whose last warps hold no rows).
    for (const auto kernels : {ops::LoraKernels::Staged, ops::LoraKernels::Registers}) {
      ops::GroupedFfnParams pk = p;
      pk.lora_bwd = kernels;
      const bool regs = kernels == ops::LoraKernels::Registers;
      run_case(
          cat("lora swiglu backward grads r=", r, regs ? " registers" : " staged").c_str(), ins,
          {"dgate_up", "dr_gu", "dB_gu", "dA_down", "dgate_up (no grads)", "dr_gu (no grads)"},
          [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
            const DType at = in[0].dtype();
            Tensor h = out(c, {N, F}, at);
            (gpu ? &ops::cuda::grouped_ffn_swiglu_forward : &ops::cpu::grouped_ffn_swiglu_forward)(
                c, in[0], h, F);
            const auto fn = gpu ? &ops::cuda::grouped_ffn_lora_swiglu_backward_grads
                                : &ops::cpu::grouped_ffn_lora_swiglu_backward_grads;
            Tensor dgu = out(c, {N, 2 * F}, at), drg = out(c, {N, r}, at), db = like(c, in[5]),
                   da = like(c, in[6]);
            fn(c, pk, in[0], in[1], off, h, in[2], in[3], in[4], dgu, drg, db, da);
            Tensor dgu2 = out(c, {N, 2 * F}, at), drg2 = out(c, {N, r}, at), no_db, no_da;
            fn(c, pk, in[0], in[1], off, h, in[2], in[3], in[4], dgu2, drg2, no_db, no_da);
            return {dgu, drg, db, da, dgu2, drg2};
          },
          seed, std::max<int64_t>(heavy, 2 * F),
          [&](Context& c, const std::vector<Tensor>& in, bool) -> std::vector<Tensor> {
            Tensor h = Tensor::empty({N, F}), dgu = Tensor::empty({N, 2 * F}),
                   drg = Tensor::empty({N, r}), db = in[5].clone(), da = in[6].clone();
            ops::cpu::grouped_ffn_swiglu_forward(c, in[0], h, F);
            h = round_bf16(h);
            ops::cpu::grouped_ffn_swiglu_backward(c, in[0], in[1], dgu, F);
            dgu = round_bf16(dgu);
            ops::grouped_matmul(c, {.form = DyW, .alpha = s}, dgu, off, in[4], drg);
            ops::grouped_matmul(c, {.form = DytX, .alpha = s, .beta = 1.f}, dgu, off, in[3], db);
            ops::grouped_matmul(c, {.form = DytX, .beta = 1.f}, in[2], off, h, da);
            return {dgu, drg, db, da, dgu, drg};
          });
    }
  }
}

}  // namespace
}  // namespace mt::test
