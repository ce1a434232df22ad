// The chunked KDA's bf16 tensor-core prep (ops/cuda/kda_fwd_tc.cu) and backward products
// (ops/cuda/kda_bwd_tc.cu) on the GPU: forward and backward (which reads the prepared block the
// prep leaves) against the CPU engine through the harness's bounds (its bf16 pass takes the
// tensor-core paths, its f32 pass the CUDA-core ones), and against the CUDA-core paths on the same
// bf16 inputs (KdaKernels::tensor_core_prep, ops/kda_prep_path.h, chooses). Head dims 64 and 128,
// packed documents whose lengths straddle the chunk, initial and final states, and decays from mild
// to strong, mixed inside a chunk so that both forms of the diagonal 16-row blocks (MMAs, direct
// pairs) run; and 32 heads, whose state passes on the H200 take 32 state columns per block. Both
// forward state passes (KdaKernels::forward_state_v2), both backward ones (backward_state_v2), both
// gradient kernels (grads_v2), both backward products (products_v2) and both preps (prep_v2):
// each against the CPU, and against each other. Each run names its kernels in its params
// (ops::KdaParams::kernels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/graph.h"
#include "core/seq_info.h"
#include "cuda/kda_inputs.h"
#include "harness/gpu_check.h"
#include "harness/op_check.h"
#include "harness/tolerance.h"
#include "ops/kda.h"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_prep_path.h"

namespace mt::test {
namespace {

enum class Decay { Mild, Moderate, Strong, Mixed };

struct TcSetup {
  int64_t heads = 2, head_k = 128, head_v = 128;
  std::vector<int64_t> lengths = {1, 63, 64, 65, 200};
  bool h0 = true, dhT = true;
  Decay decay = Decay::Mild;
  // The previous forward state pass (KdaKernels::forward_state_v2 off) instead of the default.
  bool state_v1 = false;
  // The previous backward state pass (backward_state_v2 off) instead of the default.
  bool bwd_state_v1 = false;
  // The previous gradient kernel (grads_v2 off) instead of the default.
  bool grads_v1 = false;
  // The previous backward products (products_v2 off) instead of the default.
  bool products_v1 = false;
  // The previous prep (prep_v2 off) instead of the default.
  bool prep_v1 = false;
  // Prep, then the state pass (forward_overlap off), where the overlapped forward would run (one
  // wave of 32-column state blocks: most cases here).
  bool no_overlap = false;
  // The overlap in waves (forward_overlap_waves on) where the state blocks outnumber the SMs
  // (several documents of 32 heads).
  bool overlap_waves = false;
  // The form before session 16 (ops/kda_prep_path.h): the prepared blocks kept from forward to
  // backward (keep_prepared on) and fp32 chunk states (bf16_states off), instead of the
  // default's bf16 states and backward's own prep.
  bool keep_prepared = false;
  // Backward's Delta by bwd_pre's job 0 (fused_delta off) instead of at the end of its prep (the
  // default).
  bool bwd_pre_delta = false;
  // The forward state pass in the grid's order (forward_longest_first off).
  bool doc_order = false;
};

// The kernels a setup runs (the defaults but for its flags above).
ops::KdaKernels setup_kernels(const TcSetup& s) {
  ops::KdaKernels k;
  k.forward_state_v2 = !s.state_v1;
  k.backward_state_v2 = !s.bwd_state_v1;
  k.grads_v2 = !s.grads_v1;
  k.products_v2 = !s.products_v1;
  k.prep_v2 = !s.prep_v1;
  k.forward_overlap = !s.no_overlap;
  k.forward_overlap_waves = s.overlap_waves;
  k.keep_prepared = s.keep_prepared;
  k.bf16_states = !s.keep_prepared;
  k.fused_delta = !s.bwd_pre_delta;
  k.forward_longest_first = !s.doc_order;
  return k;
}

std::string setup_name(const TcSetup& s) {
  int64_t T = 0;
  for (int64_t l : s.lengths) T += l;
  std::ostringstream n;
  n << "H" << s.heads << "K" << s.head_k << "V" << s.head_v << "_T" << T << "_docs"
    << s.lengths.size() << (s.h0 ? "_h0" : "_zeroState") << (s.dhT ? "_dhT" : "_noDhT")
    << (s.decay == Decay::Mild       ? "_mild"
        : s.decay == Decay::Moderate ? "_moderate"
        : s.decay == Decay::Strong   ? "_strong"
                                     : "_mixed")
    << (s.state_v1 ? "_stateV1" : "") << (s.bwd_state_v1 ? "_bwdStateV1" : "")
    << (s.grads_v1 ? "_gradsV1" : "") << (s.products_v1 ? "_productsV1" : "")
    << (s.prep_v1 ? "_prepV1" : "") << (s.no_overlap ? "_noOverlap" : "")
    << (s.overlap_waves ? "_overlapWaves" : "") << (s.doc_order ? "_docOrder" : "")
    << (s.keep_prepared ? "_keepPreparedF32States" : "") << (s.bwd_pre_delta ? "_bwdPreDelta" : "");
  return n.str();
}

void PrintTo(const TcSetup& s, std::ostream* os) {
  *os << setup_name(s);
}

// Mixed: a token's decays are strong with probability 0.15, so that most 16-row blocks of a
// chunk exceed the tensor-core prep's diagonal range (one strong token suffices) and some do not.
// Moderate: log decays uniform in [-4, 0], so that a 16-row block's decay range (the sum of 15
// of them, ~30 +- 4.5, and its maximum over the channels) falls on either side of the
// tensor-core prep's limit of 40: the diagonal blocks' MMAs then run with column factors up to
// e^40, next to blocks summed pair by pair.
Tensor decays(Rng& rng, const Shape& s, Decay d) {
  if (d == Decay::Moderate) {
    Tensor t = Tensor::empty(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(-rng.uniform(0.0, 4.0));
    return t;
  }
  if (d != Decay::Mixed) return log_decay(rng, s, d == Decay::Strong);
  Tensor t = Tensor::empty(s);
  const int64_t per_token = s[1] * s[2];
  for (int64_t tok = 0; tok < s[0]; ++tok) {
    const bool strong = rng.uniform(0.0, 1.0) < 0.15;
    for (int64_t e = 0; e < per_token; ++e)
      t.f32()[tok * per_token + e] = log_decay_value(rng, strong);
  }
  return t;
}

struct TcCase {
  SeqInfo seq;
  ops::KdaParams p;
  int64_t rows;
  std::vector<In> ins;  // cu_seqlens, q, k, v, g, beta, h0, dout, dhT
};

TcCase make_case(const TcSetup& s, Rng& rng) {
  TcCase c{.seq = SeqInfo::from_lengths(s.lengths)};
  const int64_t T = c.seq.tokens, N = c.seq.num_seqs, H = s.heads, K = s.head_k, V = s.head_v;
  c.p = {.tokens = T, .heads = H, .head_k = K, .head_v = V, .num_seqs = N};
  c.p.kernels = setup_kernels(s);
  c.rows = ops::kda_saved_rows(c.p, c.seq.cu_seqlens);
  c.ins = kda_inputs(rng, c.seq.cu_seqlens, T, N, H, K, V,
                     [&](Rng& r, const Shape& sh) { return decays(r, sh, s.decay); });
  return c;
}

const std::vector<std::string> kNames = {"o",  "hT", "saved", "dq", "dk",
                                         "dv", "dg", "dbeta", "dh0"};

// The case's forward + backward (kda_inputs.h, kda_forward_backward).
std::vector<Tensor> forward_backward(const TcSetup& s, const TcCase& tc, Context& c,
                                     const std::vector<Tensor>& in, bool gpu,
                                     Tensor* prepared_out = nullptr, bool round_states = false) {
  return kda_forward_backward(tc.p, tc.rows, s.h0, s.dhT, c, in, gpu, round_states, prepared_out);
}

// Whether the GPU keeps this case's chunk states in bf16 under its kernel choices (the bf16 pass:
// bf16 q, k, v).
bool gpu_states_bf16(const TcCase& tc) {
  return ops::kda_saved_dtype(Device::CUDA, tc.p, DType::BF16) == DType::BF16;
}

using Kernels = ops::KdaKernels;

// The case with some of its kernel choices changed: {choice, value} pairs.
TcCase with(TcCase tc, std::initializer_list<std::pair<bool Kernels::*, bool>> changes) {
  for (const auto& [choice, value] : changes) tc.p.kernels.*choice = value;
  return tc;
}

// The case's inputs on the GPU, q, k, v and dout in bf16.
std::vector<Tensor> bf16_on_gpu(const TcCase& tc) {
  std::vector<Tensor> din;
  for (const In& i : tc.ins) {
    const bool low = i.lowp && i.host.dtype() == DType::F32;
    Tensor d = Tensor::empty(i.host.shape(), low ? DType::BF16 : i.host.dtype(), Device::CUDA);
    d.copy_from(i.host);
    din.push_back(d);
  }
  return din;
}

class CudaKdaTc : public ::testing::TestWithParam<TcSetup> {};

TEST_P(CudaKdaTc, ForwardBackwardAgainstTheCpu) {
  REQUIRE_GPU();
  const TcSetup s = GetParam();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const TcCase tc = make_case(s, rng);
  ASSERT_TRUE(tc.p.kernels.tensor_core_prep);
  ASSERT_EQ(ops::kda_bf16_prep_path(tc.p), ops::KdaPrepPath::TensorCoreBf16);
  run_case(
      setup_name(s).c_str(), tc.ins, kNames,
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) {
        return forward_backward(s, tc, c, in, gpu);
      },
      seed, 0,
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) {
        return forward_backward(s, tc, c, in, gpu, nullptr, gpu_states_bf16(tc));
      });
}

// The same bf16 inputs through both preps: they must agree within the bf16 row of the tolerance
// table (twice the error that rounding the inputs and outputs to bf16, and the chunk states where
// the form stores them so, causes on the CPU), and so must each against the CPU, as must the
// tensor-core path with the fp32 prepared layout.
TEST_P(CudaKdaTc, TensorCorePrepAgreesWithCudaCorePrep) {
  REQUIRE_GPU();
  const TcSetup s = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat(setup_name(s), " seed=", seed));
  Rng rng(seed);
  const TcCase tc = make_case(s, rng);
  Context cpu(ContextOptions{.threads = 2, .seed = seed});
  Context gpu(ContextOptions{.device = Device::CUDA, .seed = seed});
  std::vector<Tensor> hin, emul_in;
  for (const In& i : tc.ins) {
    hin.push_back(i.host);
    emul_in.push_back(i.lowp ? round_bf16(i.host) : i.host);
  }
  const std::vector<Tensor> din = bf16_on_gpu(tc);
  const std::vector<Tensor> want = forward_backward(s, tc, cpu, hin, false);
  // The bound's emulation rounds the chunk states where this case's form stores them in bf16 (the
  // default; not keep_prepared's fp32 states), and the other form's where it does.
  const bool case_bf16 = !s.keep_prepared && gpu_states_bf16(tc);
  const std::vector<Tensor> emul = forward_backward(s, tc, cpu, emul_in, false, nullptr, case_bf16);
  const std::vector<Tensor> emul_other =
      forward_backward(s, tc, cpu, emul_in, false, nullptr, !case_bf16);
  ASSERT_EQ(ops::kda_bf16_prep_path(tc.p), ops::KdaPrepPath::TensorCoreBf16);
  const std::vector<Tensor> tensor_cores = forward_backward(s, tc, gpu, din, true);
  std::vector<Tensor> cuda_cores, fp32_block, other_state, other_bwd_state, other_grads,
      other_products, other_prep, other_overlap, other_form, other_delta;
  // Backward's Delta formed the other way (at the end of its prep, or by bwd_pre): the forward
  // untouched, the same exact products summed in another order.
  other_delta =
      forward_backward(s, with(tc, {{&Kernels::fused_delta, s.bwd_pre_delta}}), gpu, din, true);
  // Delta at the end of the prep, bwd_pre's second job by bwd_pre (where the case fuses): E and F
  // the same bits either way (the same tf32 MMAs in the same k order), so every output too.
  const std::vector<Tensor> delta_only =
      forward_backward(s, with(tc, {{&Kernels::fused_pre, false}}), gpu, din, true);
  // The other form (kept prepared blocks and fp32 chunk states, or the default): the same forward
  // arithmetic, so o and hT bit for bit and the bf16 states the fp32 ones rounded to nearest; the
  // backward from the rounded states within the bound.
  other_form = forward_backward(s,
                                with(tc, {{&Kernels::keep_prepared, !s.keep_prepared},
                                          {&Kernels::bf16_states, s.keep_prepared}}),
                                gpu, din, true);
  // The other forward state pass on the same inputs: the two differ by fp32 summation order.
  other_state =
      forward_backward(s, with(tc, {{&Kernels::forward_state_v2, s.state_v1}}), gpu, din, true);
  // The other backward state pass alone: the forward's outputs stay bit for bit (no atomics
  // anywhere in the path), the gradients differ by fp32 summation order.
  other_bwd_state = forward_backward(s, with(tc, {{&Kernels::backward_state_v2, s.bwd_state_v1}}),
                                     gpu, din, true);
  // The other gradient kernel alone (at head_k 128; elsewhere both runs take the same one): tf32
  // rounding of the pair operands and fp32 summation order apart.
  other_grads = forward_backward(s, with(tc, {{&Kernels::grads_v2, s.grads_v1}}), gpu, din, true);
  // The other products: dOS0, dRS0, Delta dS^T, Aqk and Tm bit for bit, gL's sums in another
  // order, so the gradients differ by fp32 summation order.
  other_products =
      forward_backward(s, with(tc, {{&Kernels::products_v2, s.products_v1}}), gpu, din, true);
  // The other prep: it differs in the order and width of its memory accesses and in exponentials
  // it proves need no small-result guard (the same bits), so every output is bit for bit the
  // same. Backward's Delta by bwd_pre in both (v1 never carries the fused tail, which forms it in
  // another summation order: compared with the case's unfused run below).
  other_prep = forward_backward(
      s, with(tc, {{&Kernels::prep_v2, s.prep_v1}, {&Kernels::fused_delta, false}}), gpu, din,
      true);
  // The other forward order (overlapped or prep first, where the overlap applies): the same
  // kernels' arithmetic on the same operands, 32 or 16 state columns per block (each column's MMAs
  // alike), so every output is bit for bit the same.
  other_overlap =
      forward_backward(s, with(tc, {{&Kernels::forward_overlap, s.no_overlap}}), gpu, din, true);
  cuda_cores = forward_backward(s, with(tc, {{&Kernels::tensor_core_prep, false}}), gpu, din, true);
  // The tensor-core path with the fp32 prepared layout: what the bf16 storage of W, Qh, Kl, U, Kb
  // adds to the error shows as the difference of the two tc columns below.
  fp32_block = forward_backward(s, with(tc, {{&Kernels::bf16_prepared, false}}), gpu, din, true);
  gpu.synchronize();
  for (size_t j = 0; j < want.size(); ++j) {
    const bool low = tensor_cores[j].dtype() == DType::BF16;
    const DVec w = to_dvec(want[j]), tcv = to_dvec(tensor_cores[j]), ccv = to_dvec(cuda_cores[j]),
               fbv = to_dvec(fp32_block[j]), osv = to_dvec(other_state[j]),
               obv = to_dvec(other_bwd_state[j]), ogv = to_dvec(other_grads[j]),
               opv = to_dvec(other_products[j]);
    const double bound =
        kBf16Multiple * rel_err(to_dvec(low ? round_bf16(emul[j]) : emul[j]), w) + kBf16Floor;
    const bool other_low = other_form[j].dtype() == DType::BF16;
    const double form_bound =
        kBf16Multiple * rel_err(to_dvec(other_low ? round_bf16(emul_other[j]) : emul_other[j]), w) +
        kBf16Floor;
    const double between = rel_err(tcv, ccv), tc_err = rel_err(tcv, w), cc_err = rel_err(ccv, w),
                 fb_err = rel_err(fbv, w), states = rel_err(tcv, osv),
                 bwd_states = rel_err(tcv, obv), grads_gap = rel_err(tcv, ogv),
                 prods = rel_err(tcv, opv);
    EXPECT_LE(between, bound) << kNames[j] << ": tensor-core prep against CUDA-core prep";
    EXPECT_LE(tc_err, bound) << kNames[j] << ": tensor-core prep against the CPU";
    EXPECT_LE(fb_err, bound) << kNames[j] << ": tensor cores, fp32 prepared block, against the CPU";
    // The two forms (ops/kda_prep_path.h, keep_prepared and bf16_states).
    const double form_err = rel_err(to_dvec(other_form[j]), w);
    if (j < 2) {
      EXPECT_EQ(rel_err(tcv, to_dvec(other_form[j])), 0.0)
          << kNames[j] << ": the forward of the other form (prepared kept, fp32 states)";
    } else if (j == 2) {
      const bool this_bf16 = tensor_cores[j].dtype() == DType::BF16;
      const Tensor& h = this_bf16 ? tensor_cores[j] : other_form[j];
      const Tensor& f = this_bf16 ? other_form[j] : tensor_cores[j];
      EXPECT_NE(h.dtype(), f.dtype()) << "the two forms kept the chunk states alike";
      EXPECT_EQ(rel_err(to_dvec(h), to_dvec(round_bf16(f.to(Device::CPU)))), 0.0)
          << "the bf16 chunk states are not the fp32 ones rounded to nearest";
    }
    EXPECT_EQ(rel_err(tcv, to_dvec(delta_only[j])), 0.0)
        << kNames[j] << ": bwd_pre's second job in the prep against bwd_pre's";
    const double delta_gap = rel_err(tcv, to_dvec(other_delta[j]));
    if (j < 3) {
      EXPECT_EQ(delta_gap, 0.0) << kNames[j] << ": backward's Delta changed the forward";
    } else {
      EXPECT_LE(delta_gap, bound / 4) << kNames[j] << ": Delta fused into prep against bwd_pre's";
    }
    EXPECT_LE(form_err, form_bound) << kNames[j] << ": the other form against the CPU";
    // The two forward state passes differ by fp32 summation order alone (ops/kda_prep_path.h):
    // a few ulp of fp32, which flip the bf16 rounding of a rare element of o, so their distance
    // must stay well inside the bf16 bound (a quarter of it).
    EXPECT_LE(states, bound / 4) << kNames[j] << ": forward state pass v2 against v1";
    // The backward state passes likewise (dS carried over every chunk of a document: the same
    // few ulp per step); o, hT and saved (j < 3) come from the forward alone.
    if (j < 3)
      EXPECT_EQ(bwd_states, 0.0) << kNames[j] << ": the backward state pass changed the forward";
    else
      EXPECT_LE(bwd_states, bound / 4) << kNames[j] << ": backward state pass v2 against v1";
    // The gradient kernels: the forward's outputs untouched, the gradients apart by fp32
    // summation order and v2's factorised exponentials (e^(G_i - R) e^(R - G_j) for e^(G_i -
    // G_j)), which dg's cancellations amplify: half the bound. (Session 14 call 2, with v2's
    // diagonal pairs in plain tf32: dg's gap 0.0019 at moderate decay, bound 0.0057; they are
    // 3xTF32 since.)
    if (j < 3)
      EXPECT_EQ(grads_gap, 0.0) << kNames[j] << ": the gradient kernel changed the forward";
    else
      EXPECT_LE(grads_gap, bound / 2) << kNames[j] << ": gradient kernel v2 against v1";
    const std::vector<Tensor>& unfused_run = s.bwd_pre_delta ? tensor_cores : other_delta;
    EXPECT_EQ(rel_err(to_dvec(unfused_run[j]), to_dvec(other_prep[j])), 0.0)
        << kNames[j] << ": prep v2 against v1 (backward's Delta by bwd_pre in both)";
    EXPECT_EQ(rel_err(tcv, to_dvec(other_overlap[j])), 0.0)
        << kNames[j] << ": overlapped forward against prep, then state pass";
    if (j < 3)
      EXPECT_EQ(prods, 0.0) << kNames[j] << ": the backward products changed the forward";
    else
      EXPECT_LE(prods, bound / 4) << kNames[j] << ": backward products v2 against v1";
    std::printf(
        "  %-40s %-5s tc vs cuda cores %.3g, vs cpu: tc %.3g (fp32 block %.3g), cuda cores %.3g "
        "(bound %.3g), v2 vs v1: fwd state %.3g, bwd state %.3g, grads %.3g, products %.3g, "
        "other form (%s) vs cpu %.3g, fused vs bwd_pre Delta %.3g\n",
        setup_name(s).c_str(), kNames[j].c_str(), between, tc_err, fb_err, cc_err, bound, states,
        bwd_states, grads_gap, prods, s.keep_prepared ? "default" : "kept prepared, f32 states",
        form_err, delta_gap);
  }
}

INSTANTIATE_TEST_SUITE_P(
    KdaTc, CudaKdaTc,
    ::testing::Values(
        TcSetup{.head_k = 64, .head_v = 64}, TcSetup{.lengths = {130, 7, 64, 257}, .h0 = false},
        TcSetup{.head_v = 64, .decay = Decay::Strong},
        TcSetup{.head_k = 64, .head_v = 128, .decay = Decay::Mixed},
        TcSetup{.lengths = {64, 64, 64}, .h0 = false, .dhT = false, .decay = Decay::Mixed},
        TcSetup{.lengths = {300}, .decay = Decay::Strong},
        TcSetup{.lengths = {200, 64}, .decay = Decay::Moderate},
        // More state-column blocks of 16 than fit on an H200 at once (2 x 32 x 8 > 2 x 132): the
        // state passes take 32 columns per block (kda_state_tc_common.cuh's wide_state); at head
        // dim 64 that needs three documents (3 x 32 x 4).
        TcSetup{.heads = 32, .lengths = {100, 150}},
        TcSetup{.heads = 32, .head_k = 64, .head_v = 64, .lengths = {100, 150, 30}},
        // The previous forward state pass, at both column widths and head dims.
        TcSetup{.heads = 32, .lengths = {100, 150}, .state_v1 = true},
        TcSetup{.head_k = 64, .head_v = 64, .state_v1 = true},
        TcSetup{.lengths = {300}, .decay = Decay::Strong, .state_v1 = true},
        // The previous backward state pass, at both column widths and head dims.
        TcSetup{.heads = 32, .lengths = {100, 150}, .bwd_state_v1 = true},
        TcSetup{.head_k = 64, .head_v = 64, .bwd_state_v1 = true},
        TcSetup{.lengths = {300}, .decay = Decay::Strong, .bwd_state_v1 = true},
        // The previous gradient kernel (head_k 128: the only head dim it differs at), with mild,
        // strong, mixed and moderate decays (v2's diagonal blocks on MMAs, direct, and both).
        TcSetup{.heads = 32, .lengths = {100, 150}, .grads_v1 = true},
        TcSetup{.lengths = {300}, .decay = Decay::Strong, .grads_v1 = true},
        TcSetup{.lengths = {64, 64, 64},
                .h0 = false,
                .dhT = false,
                .decay = Decay::Mixed,
                .grads_v1 = true},
        TcSetup{.lengths = {200, 64}, .decay = Decay::Moderate, .grads_v1 = true},
        // The previous backward products, at both head dims.
        TcSetup{.heads = 32, .lengths = {100, 150}, .products_v1 = true},
        TcSetup{.head_k = 64, .head_v = 64, .products_v1 = true},
        TcSetup{.head_v = 64, .lengths = {300}, .decay = Decay::Strong, .products_v1 = true},
        // The previous prep; 320 blocks, more than run at once on an H200 (2 x 132), so that the
        // other (v2) prefetches blocks of its own grid, and products v2 runs 2 or 3 items a block.
        TcSetup{.heads = 32, .lengths = {300, 300}, .prep_v1 = true},
        // Prep first, then the state pass, where the overlapped forward (the default) would run:
        // one document (2 x 4 state blocks of 32 columns), both head dims, strong decay.
        TcSetup{.lengths = {700}, .no_overlap = true},
        TcSetup{.head_k = 64, .head_v = 64, .lengths = {65, 640}, .no_overlap = true},
        TcSetup{.lengths = {300}, .decay = Decay::Strong, .no_overlap = true},
        // The overlapped forward with more prep items than prep blocks: one document of 32 heads
        // (5 chunks, 160 items over 2 x 132 - 128 persistent blocks on an H200), so that some
        // blocks run a second item in the shared memory of their first; small enough for
        // racecheck (kns=prep_tc and kns=fwd_state_v2).
        TcSetup{.heads = 32, .lengths = {300}},
        // Six documents of 32 heads (768 state blocks of 32 columns: waves on an H200), whose
        // chunk counts tie (1, 1, 1 and 2, 2): the forward state pass takes the documents longest
        // first (the chunk table's dorder), ties by index, each block finding its own document.
        TcSetup{.heads = 32, .lengths = {64, 130, 7, 65, 1, 128}},
        // The same with the overlap in waves (768 state blocks beside 132 prep blocks): against
        // the CPU, and bit for bit against prep, then the state pass (the other order's run).
        TcSetup{.heads = 32,
                .lengths = {64, 130, 7, 65, 1, 128},
                .decay = Decay::Mixed,
                .overlap_waves = true},
        // The grid's order (documents fastest) for the forward state pass, as before session 15.
        TcSetup{.heads = 32, .lengths = {64, 130, 7, 65, 1, 128}, .doc_order = true},
        // The form before session 16 (the prepared blocks kept from forward to backward, fp32
        // chunk states), at both head dims, 32-column state blocks, strong decay and T % 64 != 0.
        TcSetup{.heads = 32, .lengths = {100, 150}, .keep_prepared = true},
        TcSetup{.head_k = 64, .head_v = 64, .keep_prepared = true},
        TcSetup{.lengths = {300}, .decay = Decay::Strong, .keep_prepared = true},
        // Backward's Delta by bwd_pre's job 0 (fused_delta off) instead of at the end of its prep,
        // at both head dims, 32 heads, strong and mixed decays, T % 64 != 0.
        TcSetup{.heads = 32, .lengths = {100, 150}, .bwd_pre_delta = true},
        TcSetup{.head_k = 64, .head_v = 64, .bwd_pre_delta = true},
        TcSetup{.head_k = 64, .head_v = 128, .decay = Decay::Mixed, .bwd_pre_delta = true},
        TcSetup{.lengths = {300}, .decay = Decay::Strong, .bwd_pre_delta = true}),
    [](const ::testing::TestParamInfo<TcSetup>& pi) { return setup_name(pi.param); });

// A prepared buffer copied to the host, read in its layout: fp32 slots as they are, and the bf16
// slots (W, Qh, Kl, U, Kb where the layout is half) element by element from their raw bits.
struct Blocks {
  Tensor host;
  ops::KdaChunkLayout lay;
  int64_t count;  // blocks: chunks x heads
  double f32(int64_t b, int64_t at, int64_t e) const {
    return host.f32()[b * lay.block() + at + e];
  }
  double big(int64_t b, int64_t at, int64_t e) const {
    if (!lay.half) return f32(b, at, e);
    const auto* h = reinterpret_cast<const uint16_t*>(host.f32() + b * lay.block() + at);
    const uint32_t bits = static_cast<uint32_t>(h[e]) << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }
};

// A slot of the prepared block in the two layouts: its offsets (tensor-core path, CUDA-core
// path), elements per (chunk, head), and whether it is one of the layout's bf16 slots.
struct Part {
  const char* name;
  int64_t at_tc, at_cc, n;
  bool big;
};

// Each slot's values (every block) in a buffer, and whether all are finite.
DVec part_values(const Blocks& x, const Part& part, bool tc, size_t* nonfinite) {
  DVec v;
  for (int64_t b = 0; b < x.count; ++b)
    for (int64_t e = 0; e < part.n; ++e) {
      const int64_t at = tc ? part.at_tc : part.at_cc;
      const double y = part.big ? x.big(b, at, e) : x.f32(b, at, e);
      if (nonfinite) *nonfinite += !std::isfinite(y);
      v.push_back(y);
    }
  return v;
}

// Each slot's relative difference between the tensor-core and the CUDA-core paths' prepared
// buffers, printed for diagnosis.
void print_part_diffs(const TcSetup& s, const char* what, const Blocks& t, const Blocks& c,
                      const std::vector<Part>& parts) {
  for (const Part& part : parts)
    std::printf("  %-40s %s %-7s tensor cores vs CUDA cores: rel diff %.3g\n",
                setup_name(s).c_str(), what, part.name,
                rel_err(part_values(t, part, true, nullptr), part_values(c, part, false, nullptr)));
}

// A prepared tensor for these params on the GPU, its bytes all ones: NaN as fp32 and as each of
// its bf16 halves, so that an element the kernels leave unwritten reads as NaN in either layout.
Tensor nan_prepared(const ops::KdaParams& p, int64_t rows) {
  Tensor h = Tensor::empty({ops::kda_prepared_floats(p, rows, DType::BF16)});
  std::memset(h.f32(), 0xff, static_cast<size_t>(h.numel()) * sizeof(float));
  return h.to(Device::CUDA);
}

// The layouts the two paths take: bf16 slots on the tensor-core path, fp32 on the CUDA-core one.
std::pair<ops::KdaChunkLayout, ops::KdaChunkLayout> tc_and_cc_layouts(const ops::KdaParams& p) {
  const ops::KdaChunkLayout t = ops::kda_chunk_layout(p, DType::BF16);
  EXPECT_TRUE(t.half) << "the tensor-core path takes the bf16 layout";
  return {t, ops::KdaChunkLayout{p.chunk, p.head_k, p.head_v}};
}

// The prepared block the tensor-core prep leaves (the bf16 layout): every element written (the
// buffer starts as NaN) and finite, and above the diagonal of Aqk, KK and T exactly zero, KK's
// diagonal zero and T's one, as the CUDA-core prep leaves them in the fp32 layout. Each part's
// relative difference to the CUDA-core prep's block is printed for diagnosis (the bounds are
// those of the outputs, above; the bf16 slots differ by their rounding, 2^-9).
TEST(CudaKdaTcPrepared, BlockIsCompleteAndShapedAsTheCudaCorePreps) {
  REQUIRE_GPU();
  for (const TcSetup& s : {TcSetup{.head_v = 64, .decay = Decay::Mixed},
                           TcSetup{.head_k = 64, .decay = Decay::Mixed}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(cat(setup_name(s), " seed=", seed));
    Rng rng(seed);
    const TcCase tc = make_case(s, rng);
    const ops::KdaParams& p = tc.p;
    Context gpu(ContextOptions{.device = Device::CUDA, .seed = seed});
    const std::vector<Tensor> in = bf16_on_gpu(tc);
    const auto layouts = tc_and_cc_layouts(p);
    const ops::KdaChunkLayout tl = layouts.first, cl = layouts.second;
    const int64_t C = p.chunk, blocks = tc.rows * p.heads;
    const auto prepared_by = [&](bool tensor_cores) {
      const ops::KdaParams pp = with(tc, {{&Kernels::tensor_core_prep, tensor_cores}}).p;
      Tensor o = out(gpu, {p.tokens, p.heads, p.head_v}, DType::BF16), none;
      Tensor saved = out(gpu, {tc.rows, p.heads, p.head_k, p.head_v}, DType::F32);
      Tensor prepared =
          tensor_cores ? nan_prepared(p, tc.rows)
                       : out(gpu, {ops::kda_prepared_floats(p, tc.rows, DType::BF16)}, DType::F32);
      ops::kda_forward(gpu, pp, in[0], in[1], in[2], in[3], in[4], in[5], Tensor(), o, none, saved,
                       prepared);
      gpu.synchronize();
      return Blocks{prepared.to(Device::CPU), tensor_cores ? tl : cl, blocks};
    };
    const Blocks t = prepared_by(true), c = prepared_by(false);
    ASSERT_EQ(t.host.numel(), blocks * tl.block());
    ASSERT_EQ(c.host.numel(), blocks * cl.block());
    size_t nonfinite = 0, misshaped = 0;
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t i = 0; i < C; ++i)
        for (int64_t j = i; j < C; ++j) {
          const int64_t at = i * C + j;
          const double aqk = t.f32(b, tl.Aqk(), at), kk = t.f32(b, tl.KK(), at),
                       tm = t.f32(b, tl.Tm(), at);
          misshaped += j > i ? (aqk != 0 || kk != 0 || tm != 0) : (kk != 0 || tm != 1);
        }
    const std::vector<Part> parts = {
        {"W", tl.W(), cl.W(), C * p.head_k, true},    {"Qh", tl.Qh(), cl.Qh(), C * p.head_k, true},
        {"Kl", tl.Kl(), cl.Kl(), C * p.head_k, true}, {"U", tl.U(), cl.U(), C * p.head_v, true},
        {"Kb", tl.Kb(), cl.Kb(), C * p.head_k, true}, {"Aqk", tl.Aqk(), cl.Aqk(), C * C, false},
        {"T", tl.Tm(), cl.Tm(), C * C, false},        {"KK", tl.KK(), cl.KK(), C * C, false},
        {"gL", tl.gL(), cl.gL(), p.head_k, false}};
    // Every element of every slot, read in the layout's own types (the slots tile the block).
    for (const Part& part : parts) part_values(t, part, true, &nonfinite);
    EXPECT_EQ(nonfinite, 0u) << "prepared elements unwritten or not finite";
    EXPECT_EQ(misshaped, 0u) << "entries on or above the diagonals of Aqk, KK, T";
    print_part_diffs(s, "prepared", t, c, parts);
  }
}

// The products backward leaves in the prepared block (ops/cuda/kda_bwd_tc.cu on tensor cores,
// kda_chunk_products.cu's products_kernel with the switch off; ops/kda_chunk_layout.h's slots in
// the two layouts): finite, Aqk exactly zero above its diagonal and T on and above its own, as
// products_kernel leaves them. Each slot's relative difference between the two is printed for
// diagnosis (the bounds are those of the gradients, which read these slots: CudaKdaTc above).
// Delta dS^T, which the bf16 layout keeps in the workspace, reaches the test only through them.
TEST(CudaKdaTcPrepared, BackwardProductsAreCompleteAndShapedAsTheCudaCoreOnes) {
  REQUIRE_GPU();
  for (const TcSetup& s : {TcSetup{.head_v = 64, .decay = Decay::Mixed},
                           TcSetup{.head_k = 64, .lengths = {130, 7, 64, 257}, .h0 = false}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(cat(setup_name(s), " seed=", seed));
    Rng rng(seed);
    const TcCase tc = make_case(s, rng);
    const ops::KdaParams& p = tc.p;
    Context gpu(ContextOptions{.device = Device::CUDA, .seed = seed});
    const std::vector<Tensor> in = bf16_on_gpu(tc);
    const auto layouts = tc_and_cc_layouts(p);
    const ops::KdaChunkLayout tl = layouts.first, cl = layouts.second;
    const int64_t C = p.chunk, blocks = tc.rows * p.heads;
    const auto products_by = [&](bool tensor_cores) {
      // keep_prepared: the block backward leaves, read below.
      const TcCase run =
          with(tc, {{&Kernels::tensor_core_prep, tensor_cores}, {&Kernels::keep_prepared, true}});
      Tensor prepared;
      forward_backward(s, run, gpu, in, true, &prepared);
      gpu.synchronize();
      return Blocks{prepared.to(Device::CPU), tensor_cores ? tl : cl, blocks};
    };
    const Blocks t = products_by(true), c = products_by(false);
    const std::vector<Part> parts = {{"dO S0^T", tl.dOS0(), cl.dOS0(), C * p.head_k, false},
                                     {"dR S0^T", tl.dRS0(), cl.dRS0(), C * p.head_k, false},
                                     {"dO D^T", tl.Aqk(), cl.Aqk(), C * C, false},
                                     {"-dR D^T", tl.Tm(), cl.Tm(), C * C, false},
                                     {"S0.dS", tl.gL(), cl.gL(), p.head_k, false}};
    size_t nonfinite = 0, misshaped = 0;
    for (const Part& part : parts) part_values(t, part, true, &nonfinite);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t i = 0; i < C; ++i)
        for (int64_t j = i; j < C; ++j) {
          const int64_t at = i * C + j;
          misshaped += (j > i && t.f32(b, tl.Aqk(), at) != 0) || t.f32(b, tl.Tm(), at) != 0;
        }
    EXPECT_EQ(nonfinite, 0u) << "backward products unwritten or not finite";
    EXPECT_EQ(misshaped, 0u) << "entries above the diagonal of dO D^T or on and above -dR D^T's";
    print_part_diffs(s, "backward", t, c, parts);
  }
}

// The overlapped forward at the scale it is for (ops/kda_prep_path.h): one document of 32 heads
// and 128 or 64 chunks, 128 or 64 state blocks of 32 columns waiting on 4096 or 2048 prep
// blocks, far more than run at once, so that the state pass catches up with the prep and waits
// on its flags. Training forward + backward and the evaluation forward, each bit for bit what
// prep, then the state pass, gives (that order is checked against the CPU above; the CPU pass
// at this size would take minutes).
TEST(CudaKdaTcOverlap, LongDocumentMatchesPrepThenStatePass) {
  REQUIRE_GPU();
  for (const TcSetup& s :
       {TcSetup{.heads = 32, .lengths = {8192}, .h0 = true},
        TcSetup{
            .heads = 32, .head_k = 64, .head_v = 64, .lengths = {4000}, .decay = Decay::Mixed}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(cat(setup_name(s), " seed=", seed));
    Rng rng(seed);
    const TcCase tc = make_case(s, rng);
    // Backward's prepared blocks (not kept from forward by default), Delta, dR and outgoing dS
    // per chunk: 1.1 GB of workspace at 8192 tokens.
    Context gpu(
        ContextOptions{.device = Device::CUDA, .seed = seed, .workspace_bytes = size_t{2} << 30});
    const std::vector<Tensor> din = bf16_on_gpu(tc);
    ASSERT_TRUE(tc.p.kernels.forward_overlap);
    // The evaluation forward (nothing kept for backward: the state pass skips `saved`, the prep
    // T, KK and Kb) under the case's kernels or `serial`'s: o and hT, then its saved and prepared
    // buffers.
    bool serial_order = false;
    ops::KdaParams pe = tc.p;
    pe.keep_for_backward = false;
    const auto eval_buffers = [&] {
      const int64_t T = pe.tokens, N = pe.num_seqs, H = pe.heads, K = pe.head_k, V = pe.head_v;
      return std::vector<Tensor>{Tensor::empty({T, H, V}, DType::BF16, Device::CUDA),
                                 Tensor::empty({N, H, K, V}, DType::F32, Device::CUDA),
                                 Tensor::empty({tc.rows, H, K, V}, DType::F32, Device::CUDA),
                                 Tensor::empty({ops::kda_prepared_floats(pe, tc.rows, DType::BF16)},
                                               DType::F32, Device::CUDA)};
    };
    const auto eval_into = [&](std::vector<Tensor>& b) {
      pe.kernels.forward_overlap = !serial_order;
      ops::kda_forward(gpu, pe, din[0], din[1], din[2], din[3], din[4], din[5], din[6], b[0], b[1],
                       b[2], b[3]);
    };
    const auto eval = [&] {
      std::vector<Tensor> b = eval_buffers();
      eval_into(b);
      return std::vector<Tensor>{b[0], b[1]};
    };
    const std::vector<Tensor> overlapped = forward_backward(s, tc, gpu, din, true);
    const std::vector<Tensor> overlapped_eval = eval();
    const std::vector<Tensor> serial =
        forward_backward(s, with(tc, {{&Kernels::forward_overlap, false}}), gpu, din, true);
    serial_order = true;
    const std::vector<Tensor> serial_eval = eval();
    serial_order = false;
    gpu.synchronize();
    for (size_t j = 0; j < overlapped.size(); ++j) {
      const DVec a = to_dvec(overlapped[j]), b = to_dvec(serial[j]);
      EXPECT_EQ(rel_err(a, b), 0.0) << kNames[j] << ": overlapped against prep, then state";
      size_t nonfinite = 0;
      for (double x : a) nonfinite += !std::isfinite(x);
      EXPECT_EQ(nonfinite, 0u) << kNames[j];
    }
    for (size_t j = 0; j < overlapped_eval.size(); ++j) {
      EXPECT_EQ(rel_err(to_dvec(overlapped_eval[j]), to_dvec(serial_eval[j])), 0.0)
          << kNames[j] << ": evaluation forward, overlapped against prep, then state";
      // The evaluation forward's o and hT are the training forward's (docs/gpu.md).
      EXPECT_EQ(rel_err(to_dvec(overlapped_eval[j]), to_dvec(overlapped[j])), 0.0)
          << kNames[j] << ": evaluation forward against the training forward";
    }
    // That the overlapped path ran (it zeroes its flags: one memset node more than prep, then
    // the state pass, so that this test cannot pass by comparing the serial order with itself),
    // and that a CUDA graph of it (the programmatic dependent launch inside) replays the eager
    // evaluation forward bit for bit.
    std::vector<Tensor> b = eval_buffers();
    OpGraph graph, serial_graph;
    graph.capture(gpu, [&] { eval_into(b); });
    serial_order = true;
    serial_graph.capture(gpu, [&] { eval_into(b); });
    serial_order = false;
    EXPECT_EQ(graph.nodes().memsets, serial_graph.nodes().memsets + 1)
        << "the overlapped forward did not run (no flags zeroed)";
    graph.replay(gpu);
    gpu.synchronize();
    for (size_t j = 0; j < overlapped_eval.size(); ++j)
      EXPECT_EQ(rel_err(to_dvec(b[j]), to_dvec(overlapped_eval[j])), 0.0)
          << kNames[j] << ": the overlapped forward replayed from a CUDA graph against eager";
  }
}

}  // namespace
}  // namespace mt::test
