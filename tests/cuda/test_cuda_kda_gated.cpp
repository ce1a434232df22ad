// The KDA core with its decay gate fused (ops::kda_gated_*) on the GPU against the CPU, which runs
// the gate and the core one after the other (double-checked against tests/ref in
// tests/ops/test_kda.cpp): every output and gradient, o, hT, saved, dq, dk, dv, draw, dbeta,
// dA_log, ddt_bias and dh0, through the harness's f32 and bf16 passes. Packed documents whose
// lengths straddle the chunk (T not a multiple of it), head dims 64 and 128, mild and strong
// decays (raw past softplus's threshold 20, large A_log), and on bf16 both the tensor-core and
// the CUDA-core preps (the f32 pass always takes the latter).
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "core/seq_info.h"
#include "cuda/kda_inputs.h"
#include "harness/gpu_check.h"
#include "harness/op_check.h"
#include "ops/kda.h"
#include "ops/kda_prep_path.h"

namespace mt::test {
namespace {

struct GatedSetup {
  int64_t head_k = 64, head_v = 64;
  bool strong = false;
  bool tensor_core_prep = true;  // false: the CUDA-core prep and products on bf16 too
};

std::string gated_name(const GatedSetup& s) {
  std::string n = std::string(s.strong ? "Strong" : "Mild") + "Decay_K";
  n += std::to_string(s.head_k);
  n += "V";
  n += std::to_string(s.head_v);
  n += s.tensor_core_prep ? "_tensorCorePrep" : "_cudaCorePrep";
  return n;
}

void PrintTo(const GatedSetup& s, std::ostream* os) {
  *os << gated_name(s);
}

// Scoped switch to the CUDA-core prep (process-wide, so restored on every exit).
struct PrepSwitch {
  explicit PrepSwitch(bool tensor_cores) { ops::kda_set_tensor_core_prep(tensor_cores); }
  ~PrepSwitch() { ops::kda_set_tensor_core_prep(true); }
};

// The gate's raw input [T, H, K]: mild (softplus of about -3: decays near -0.05 per token) or
// strong (a spread of 12 around 8, so that many entries pass softplus's threshold of 20; with
// exp(A_log) up to about 16, g reaches the hundreds).
Tensor gate_raw(Rng& rng, const Shape& s, bool strong) {
  Tensor t = randn(rng, s, strong ? 12.0 : 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] += strong ? 8.f : -3.f;
  if (strong) t.f32()[3] = 25.f;  // at least one on the identity branch whatever the draw
  return t;
}

class CudaKdaGated : public ::testing::TestWithParam<GatedSetup> {};

TEST_P(CudaKdaGated, ForwardBackwardMatchesTheCpuComposite) {
  REQUIRE_GPU();
  const GatedSetup s = GetParam();
  const PrepSwitch prep(s.tensor_core_prep);
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const SeqInfo seq = SeqInfo::from_lengths({1, 63, 64, 65, 200});
  const int64_t T = seq.tokens, N = seq.num_seqs, H = 2, K = s.head_k, V = s.head_v;
  const ops::KdaParams p{
      .tokens = T, .heads = H, .head_k = K, .head_v = V, .num_seqs = N, .chunked = true};
  ASSERT_TRUE(ops::kda_chunk_kernel_fits(p));  // the fused kernels, not the composite fallback
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  Tensor beta = random_beta(rng, T, H);
  Tensor a_log = randn(rng, {H}, 0.5);
  for (int64_t h = 0; h < H; ++h) a_log.f32()[h] += s.strong ? 2.f : 0.f;  // exp: ~7.4 or ~1
  const std::vector<In> ins = {{seq.cu_seqlens, false},
                               {randn(rng, {T, H, K})},
                               {unit_rows(rng, {T, H, K})},
                               {randn(rng, {T, H, V})},
                               {gate_raw(rng, {T, H, K}, s.strong)},
                               {a_log, false},
                               {randn(rng, {H * K}, 0.5), false},
                               {beta, false},
                               {randn(rng, {N, H, K, V}, 0.5), false},
                               {randn(rng, {T, H, V})},
                               {randn(rng, {N, H, K, V}), false},
                               {randn(rng, {H}, 1e-2), false},
                               {randn(rng, {H * K}, 1e-2), false}};
  run_case(
      gated_name(s).c_str(), ins,
      {"o", "hT", "saved", "dq", "dk", "dv", "draw", "dbeta", "dA_log", "ddt_bias", "dh0"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType dt = in[1].dtype();
        Tensor o = out(c, {T, H, V}, dt), hT = out(c, {N, H, K, V}, DType::F32);
        Tensor saved = out(c, {rows, H, K, V}, DType::F32);
        // Carried from forward to backward as the layer does on the GPU.
        Tensor prepared =
            gpu ? out(c, {ops::kda_prepared_floats(p, rows, dt)}, DType::F32) : Tensor();
        OP(kda_gated_forward)
        (c, p, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8], o, hT, saved,
         prepared);
        Tensor dq = out(c, {T, H, K}, dt), dk = out(c, {T, H, K}, dt), dv = out(c, {T, H, V}, dt);
        Tensor draw = out(c, {T, H, K}, dt), dbeta = out(c, {T, H}, DType::F32);
        Tensor da = like(c, in[11]), ddt = like(c, in[12]);
        Tensor dh0 = out(c, {N, H, K, V}, DType::F32);
        OP(kda_gated_backward)
        (c, p, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], saved, prepared, in[9],
         in[10], dq, dk, dv, draw, da, ddt, dbeta, dh0);
        return {o, hT, saved, dq, dk, dv, draw, dbeta, da, ddt, dh0};
      },
      seed, T* K);  // dA_log: a sum over the tokens and the head's channels
}

INSTANTIATE_TEST_SUITE_P(
    KdaGated, CudaKdaGated,
    ::testing::Values(GatedSetup{}, GatedSetup{.strong = true},
                      GatedSetup{.head_k = 128, .head_v = 128},
                      GatedSetup{.head_k = 128, .head_v = 128, .strong = true},
                      GatedSetup{.head_k = 128, .head_v = 64, .strong = true},
                      GatedSetup{.tensor_core_prep = false},
                      GatedSetup{.head_k = 128, .head_v = 128, .tensor_core_prep = false},
                      GatedSetup{
                          .head_k = 128, .head_v = 128, .strong = true, .tensor_core_prep = false}),
    [](const ::testing::TestParamInfo<GatedSetup>& pi) { return gated_name(pi.param); });

// Chunks shorter than the documents and an odd head: the CUDA-core kernels' general shapes (one
// block per (chunk, head) over all channels), still fused; zero initial state, no dhT.
TEST(CudaKdaGatedShapes, SmallOddHeadsAndShortChunks) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const SeqInfo seq = SeqInfo::from_lengths({3, 40, 17});
  const int64_t T = seq.tokens, N = seq.num_seqs, H = 3, K = 13, V = 7;
  const ops::KdaParams p{.tokens = T,
                         .heads = H,
                         .head_k = K,
                         .head_v = V,
                         .num_seqs = N,
                         .chunked = true,
                         .chunk = 16};
  ASSERT_TRUE(ops::kda_chunk_kernel_fits(p));
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  const std::vector<In> ins = {{seq.cu_seqlens, false},           {randn(rng, {T, H, K})},
                               {unit_rows(rng, {T, H, K})},       {randn(rng, {T, H, V})},
                               {gate_raw(rng, {T, H, K}, true)},  {randn(rng, {H}, 0.5), false},
                               {randn(rng, {H * K}, 0.5), false}, {random_beta(rng, T, H), false},
                               {randn(rng, {T, H, V})},           {randn(rng, {H}, 1e-2), false},
                               {randn(rng, {H * K}, 1e-2), false}};
  run_case(
      "kda_gated_small", ins,
      {"o", "hT", "dq", "dk", "dv", "draw", "dbeta", "dA_log", "ddt_bias", "dh0"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType dt = in[1].dtype();
        Tensor o = out(c, {T, H, V}, dt), hT = out(c, {N, H, K, V}, DType::F32);
        Tensor saved = out(c, {rows, H, K, V}, DType::F32), none;
        OP(kda_gated_forward)
        (c, p, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], Tensor(), o, hT, saved,
         none);
        Tensor dq = out(c, {T, H, K}, dt), dk = out(c, {T, H, K}, dt), dv = out(c, {T, H, V}, dt);
        Tensor draw = out(c, {T, H, K}, dt), dbeta = out(c, {T, H}, DType::F32);
        Tensor da = like(c, in[9]), ddt = like(c, in[10]);
        Tensor dh0 = out(c, {N, H, K, V}, DType::F32);
        OP(kda_gated_backward)
        (c, p, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], saved, none, in[8], Tensor(),
         dq, dk, dv, draw, da, ddt, dbeta, dh0);
        return {o, hT, dq, dk, dv, draw, dbeta, da, ddt, dh0};
      },
      seed, T* K);
}

}  // namespace
}  // namespace mt::test
