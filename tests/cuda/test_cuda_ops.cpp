// The first CUDA op families against the CPU engine, through harness/gpu_check.h (which says how a
// case is run and compared). Without a GPU every test skips, saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/seq_info.h"
#include "harness/gpu_check.h"
#include "harness/op_check.h"
#include "ops/activation.h"
#include "ops/conv1d.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/kda_gate.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/optim.h"
#include "ops/rope.h"

namespace mt::test {
namespace {

// The strided copy against the CPU's, over views of buffers whose other elements must stay as they
// were (the whole destination buffer is compared): layouts the 16-byte row path takes (2-D column
// blocks, leading dimensions that merge, a dimension of size 1) and the ones it leaves to the
// element-wise path (leading dimensions that do not merge, an odd width, a base off 16 bytes), and
// a conversion into f32. Both passes: f32 and bf16 elements.
TEST(CudaElementwise, StridedCopyEveryLayoutAgainstTheCpu) {
  REQUIRE_GPU();
  struct Case {
    const char* name;
    Shape src_buf, dst_buf;
    std::function<Tensor(const Tensor&)> src_view, dst_view;
    bool dst_f32 = false;
  };
  const std::vector<Case> cases = {
      {"column blocks",
       {64, 160},
       {64, 128},
       [](const Tensor& t) { return t.cols(16, 112); },
       [](const Tensor& t) { return t.cols(32, 128); }},
      {"leading dims merge",
       {3, 5, 24},
       {3, 5, 32},
       [](const Tensor& t) { return t; },
       [](const Tensor& t) { return t.cols(8, 32); }},
      {"leading dims do not merge",
       {3, 5, 24},
       {3, 6, 32},
       [](const Tensor& t) { return t; },
       [](const Tensor& t) { return t.narrow(1, 0, 5).cols(8, 32); }},
      {"odd width",
       {33, 7},
       {33, 16},
       [](const Tensor& t) { return t; },
       [](const Tensor& t) { return t.cols(3, 10); }},
      {"base off 16 bytes",
       {40, 72},
       {40, 64},
       [](const Tensor& t) { return t.cols(1, 65); },
       [](const Tensor& t) { return t; }},
      {"a dimension of size 1",
       {4, 1, 64},
       {4, 1, 96},
       [](const Tensor& t) { return t; },
       [](const Tensor& t) { return t.cols(16, 80); }},
      {"into f32",
       {32, 48},
       {32, 64},
       [](const Tensor& t) { return t; },
       [](const Tensor& t) { return t.cols(8, 56); },
       true},
  };
  for (const Case& k : cases) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    run_case(
        cat("strided copy, ", k.name).c_str(),
        {{randn(rng, k.src_buf)}, {randn(rng, k.dst_buf), !k.dst_f32}}, {"destination"},
        [&](Context& c, const std::vector<Tensor>& v, bool) -> std::vector<Tensor> {
          Tensor dst = like(c, v[1]), d = k.dst_view(dst);
          ops::copy(c, k.src_view(v[0]), d);
          return {dst};
        },
        seed);
  }
}

// map_elements' three paths (ops/cuda/common.cuh) under every op on it, against the CPU: 16-byte
// packs (aligned bases, a whole number of packs: 2048 x 3 elements), packs and a tail (1001 x 3),
// and an element a thread (views one row into [rows, 3] buffers: bases 12 or 6 bytes off a pack).
// The conversion's round trip (f32 -> bf16 -> f32, bf16 -> f32 -> bf16) rounds alike on both.
TEST(CudaElementwise, PackedTailAndUnalignedPathsAgainstTheCpu) {
  REQUIRE_GPU();
  for (const int64_t rows : {int64_t{2048}, int64_t{1001}})
    for (const bool offset : {false, true}) {
      const uint64_t seed = fresh_seed();
      Rng rng(seed);
      const Shape s{rows, 3};
      std::vector<In> ins = {{randn(rng, s, 3.0)}, {randn(rng, s)}, {randn(rng, s)}};
      const auto view = [&](const Tensor& t) { return offset ? t.rows(1, rows) : t; };
      run_case(
          cat("element-wise paths, ", rows, " x 3", offset ? ", off a pack" : "").c_str(), ins,
          {"silu", "dsilu", "swiglu", "dgate", "dup", "sgate", "dx", "dg", "add_into", "scale",
           "sigmoid", "dsigmoid", "converted"},
          [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
            const DType t = in[0].dtype();
            const Tensor x = view(in[0]), g = view(in[1]), d = view(in[2]);
            std::vector<Tensor> bufs;
            const auto result = [&] {
              bufs.push_back(out(c, s, t));
              return view(bufs.back());
            };
            Tensor y1 = result(), d1 = result(), y2 = result(), dg = result(), du = result(),
                   y3 = result(), dx3 = result(), dg3 = result(), acc = result(), sc = result(),
                   sg = result(), dsg = result(), back = result();
            OP(silu_forward)(c, x, y1);
            OP(silu_backward)(c, x, d, d1);
            OP(swiglu_forward)(c, x, g, y2);
            OP(swiglu_backward)(c, x, g, d, dg, du);
            OP(sigmoid_gate_forward)(c, g, x, y3);
            OP(sigmoid_gate_backward)(c, g, x, d, dx3, dg3);
            ops::copy(c, g, acc);
            ops::add_into(c, x, acc);
            ops::scale(c, d, -1.5f, sc);
            ops::sigmoid_forward(c, x, sg);
            ops::sigmoid_backward(c, sg, d, dsg);
            const DType other = t == DType::F32 ? DType::BF16 : DType::F32;
            Tensor conv_buf = out(c, s, other), conv = view(conv_buf);
            ops::copy(c, x, conv);
            ops::copy(c, conv, back);
            return {y1, d1, y2, dg, du, y3, dx3, dg3, acc, sc, sg, dsg, back};
          },
          seed);
    }
}

class CudaNorm : public ::testing::TestWithParam<int64_t> {};

// rmsnorm forward and backward over R x D against the CPU; `terms`: dw's sum over the rows.
void check_rmsnorm(const char* name, int64_t R, int64_t D, int64_t terms = 0) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const ops::NormParams p{.rows = R, .dim = D, .eps = 1e-6f};
  std::vector<In> ins = {{randn(rng, {R, D}, 2.0)},
                         {randn(rng, {D})},
                         {randn(rng, {R, D})},
                         {randn(rng, {D}, 1e-2), false}};
  run_case(
      name, ins, {"y", "rstd", "dx", "dw"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor y = out(c, {R, D}, in[0].dtype()), rstd = out(c, {R}, DType::F32);
        OP(rmsnorm_forward)(c, p, in[0], in[1], y, rstd);
        Tensor dx = out(c, {R, D}, in[0].dtype()), dw = like(c, in[3]);
        OP(rmsnorm_backward)(c, p, in[0], in[1], rstd, in[2], dx, dw);
        return {y, rstd, dx, dw};
      },
      seed, terms);
}

TEST_P(CudaNorm, RmsNormForwardBackward) {
  REQUIRE_GPU();
  check_rmsnorm("rmsnorm", 257, GetParam());
}

// More rows than 64-row chunks fit in a grid's y extent (65535): the per-head norms of a long
// sequence (131072 tokens x 32 heads) reach this; the weight gradient's column sum takes longer
// chunks there.
TEST(CudaNormLong, RmsNormWeightGradientOverFourMillionRows) {
  REQUIRE_GPU();
  const int64_t R = 65535 * 64 + 65;
  check_rmsnorm("rmsnorm 4M rows", R, 8, /*terms=*/R);
}

TEST_P(CudaNorm, LayerNormForwardBackward) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t R = 129, D = GetParam();
  const ops::NormParams p{.rows = R, .dim = D, .eps = 1e-5f};
  Tensor x = randn(rng, {R, D}, 2.0);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] += 3.f;  // the mean must be removed first
  std::vector<In> ins = {{x},
                         {randn(rng, {D})},
                         {randn(rng, {D})},
                         {randn(rng, {R, D})},
                         {randn(rng, {D}, 1e-2), false},
                         {randn(rng, {D}, 1e-2), false}};
  run_case(
      "layernorm", ins, {"y", "mean", "rstd", "dx", "dw", "db"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor y = out(c, {R, D}, in[0].dtype());
        Tensor mean = out(c, {R}, DType::F32), rstd = out(c, {R}, DType::F32);
        OP(layernorm_forward)(c, p, in[0], in[1], in[2], y, mean, rstd);
        Tensor dx = out(c, {R, D}, in[0].dtype()), dw = like(c, in[4]), db = like(c, in[5]);
        OP(layernorm_backward)(c, p, in[0], in[1], mean, rstd, in[3], dx, dw, db);
        return {y, mean, rstd, dx, dw, db};
      },
      seed);
}

TEST_P(CudaNorm, L2NormForwardBackward) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t R = 300, D = GetParam();
  const ops::NormParams p{.rows = R, .dim = D, .eps = 1e-6f};
  std::vector<In> ins = {{randn(rng, {R, D})}, {randn(rng, {R, D})}};
  run_case(
      "l2norm", ins, {"y", "rstd", "dx"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor y = out(c, {R, D}, in[0].dtype()), rstd = out(c, {R}, DType::F32);
        OP(l2norm_forward)(c, p, in[0], y, rstd);
        Tensor dx = out(c, {R, D}, in[0].dtype());
        OP(l2norm_backward)(c, p, in[0], rstd, in[1], dx);
        return {y, rstd, dx};
      },
      seed);
}

INSTANTIATE_TEST_SUITE_P(Dims, CudaNorm, ::testing::Values(64, 128, 2304));

TEST(CudaActivation, SiluSwigluSigmoidGate) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const Shape s{1000, 96};
  std::vector<In> ins = {{randn(rng, s, 3.0)}, {randn(rng, s)}, {randn(rng, s)}};
  run_case(
      "activations", ins, {"silu", "dsilu", "swiglu", "dgate", "dup", "sgate", "dx", "dg"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType t = in[0].dtype();
        Tensor y1 = out(c, s, t), d1 = out(c, s, t);
        OP(silu_forward)(c, in[0], y1);
        OP(silu_backward)(c, in[0], in[2], d1);
        Tensor y2 = out(c, s, t), dg = out(c, s, t), du = out(c, s, t);
        OP(swiglu_forward)(c, in[0], in[1], y2);
        OP(swiglu_backward)(c, in[0], in[1], in[2], dg, du);
        Tensor y3 = out(c, s, t), dx3 = out(c, s, t), dg3 = out(c, s, t);
        OP(sigmoid_gate_forward)(c, in[1], in[0], y3);
        OP(sigmoid_gate_backward)(c, in[1], in[0], in[2], dx3, dg3);
        return {y1, d1, y2, dg, du, y3, dx3, dg3};
      },
      seed);
}

TEST(CudaEmbedding, LookupAndGradientWithRepeatedIds) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t T = 700, V = 50, D = 130;  // far more tokens than ids: every row repeats
  Tensor ids = Tensor::empty({T}, DType::I32);
  for (int64_t t = 0; t < T; ++t) ids.i32()[t] = static_cast<int32_t>(rng.below(V));
  const ops::EmbeddingParams p{.tokens = T, .vocab = V, .dim = D};
  std::vector<In> ins = {
      {ids, false}, {randn(rng, {V, D})}, {randn(rng, {T, D})}, {randn(rng, {V, D}, 1e-2), false}};
  run_case(
      "embedding", ins, {"y", "dtable"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor y = out(c, {T, D}, in[1].dtype()), dt = like(c, in[3]);
        OP(embedding_forward)(c, p, in[0], in[1], y);
        OP(embedding_backward)(c, p, in[0], in[2], dt);
        return {y, dt};
      },
      seed);
}

// The gradient's sort by id over a long batch: half the tokens share one id (a run of 20000 rows
// summed by one block), the rest spread over a vocabulary that needs 12 of the sort's bits.
TEST(CudaEmbedding, GradientOverALongSkewedBatch) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t T = 40000, V = 3000, D = 64;
  Tensor ids = Tensor::empty({T}, DType::I32);
  for (int64_t t = 0; t < T; ++t)
    ids.i32()[t] = static_cast<int32_t>(t % 2 == 0 ? 7 : rng.below(V));
  const ops::EmbeddingParams p{.tokens = T, .vocab = V, .dim = D};
  std::vector<In> ins = {
      {ids, false}, {randn(rng, {V, D})}, {randn(rng, {T, D})}, {randn(rng, {V, D}, 1e-2), false}};
  run_case(
      "embedding long", ins, {"dtable"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor dt = like(c, in[3]);
        OP(embedding_backward)(c, p, in[0], in[2], dt);
        return {dt};
      },
      seed, /*reduction_terms=*/T / 2);
}

TEST(CudaEmbedding, OutOfRangeIdIsAnErrorNamingThePosition) {
  REQUIRE_GPU();
  Context c(ContextOptions{.device = Device::CUDA});
  Tensor ids = Tensor::empty({4}, DType::I32);
  const int32_t v[] = {1, 2, 9, 0};
  for (int i = 0; i < 4; ++i) ids.i32()[i] = v[i];
  Tensor dids = ids.to(Device::CUDA);
  Tensor table = Tensor::zeros({5, 8}, DType::F32, Device::CUDA);
  Tensor y = Tensor::empty({4, 8}, DType::F32, Device::CUDA);
  try {
    ops::cuda::embedding_forward(c, {.tokens = 4, .vocab = 5, .dim = 8}, dids, table, y);
    FAIL() << "an id outside the vocabulary was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 9 at position 2"), std::string::npos)
        << e.what();
  }
}

TEST(CudaRope, BothLayoutsWithYarnForwardAndInverse) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t T = 97, H = 3, D = 40;
  Tensor pos = Tensor::empty({T}, DType::I32);
  for (int64_t t = 0; t < T; ++t) pos.i32()[t] = static_cast<int32_t>(rng.below(100000));
  for (ops::RopeStyle style : {ops::RopeStyle::HalfSplit, ops::RopeStyle::Interleaved}) {
    ops::RopeParams p{.tokens = T,
                      .heads = H,
                      .head_dim = D,
                      .rot_offset = 8,
                      .rot_dim = 24,
                      .theta = 10000.f,
                      .style = style};
    p.scaling = {.factor = 4.f, .original_max_positions = 4096, .magnitude = 1.1f};
    std::vector<In> ins = {{pos, false}, {randn(rng, {T, H, D})}, {randn(rng, {T, H, D})}};
    run_case(
        style == ops::RopeStyle::HalfSplit ? "rope half-split" : "rope interleaved", ins,
        {"y", "dx"},
        [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
          Tensor y = out(c, {T, H, D}, in[1].dtype()), dx = out(c, {T, H, D}, in[1].dtype());
          // The CUDA body is one rotation by +-1 times the angles (ops/rope.h).
          if (gpu) {
            ops::cuda::rope_rotate(c, p, in[0], in[1], y, 1.0);
            ops::cuda::rope_rotate(c, p, in[0], in[2], dx, -1.0);
          } else {
            ops::rope_forward(c, p, in[0], in[1], y);
            ops::rope_backward(c, p, in[0], in[2], dx);
          }
          return {y, dx};
        },
        seed);
  }
}

class CudaLinear : public ::testing::TestWithParam<int64_t> {};

TEST_P(CudaLinear, ProjectionWithLoraForwardBackward) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t T = 333, I = 192, O = 160, r = GetParam();
  const ops::LinearParams p{.tokens = T, .in = I, .out = O, .lora_rank = r, .lora_alpha = 32.f};
  const int64_t rr = r ? r : 1;
  std::vector<In> ins = {{randn(rng, {T, I})},
                         {randn(rng, {O, I}, 0.1)},
                         {randn(rng, {rr, I}, 0.1)},
                         {randn(rng, {O, rr}, 0.1)},
                         {randn(rng, {T, O})},
                         {randn(rng, {T, I}), true},  // dx prefill: accumulate_dx adds to it
                         {randn(rng, {O, I}, 1e-2), false},
                         {randn(rng, {rr, I}, 1e-2), false},
                         {randn(rng, {O, rr}, 1e-2), false}};
  run_case(
      r ? "linear+lora" : "linear", ins, {"y", "dx", "dw", "da", "db"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType t = in[0].dtype();
        Tensor y = out(c, {T, O}, t), xa = r ? out(c, {T, r}, t) : Tensor();
        OP(linear_forward)(c, p, in[0], in[1], in[2], in[3], y, xa);
        Tensor dx = like(c, in[5]), dw = like(c, in[6]), da = like(c, in[7]), db = like(c, in[8]);
        OP(linear_backward)(c, p, in[0], in[1], in[2], in[3], xa, in[4], dx, dw, da, db, true);
        return {y, dx, dw, da, db};
      },
      seed);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaLinear, ::testing::Values(0, 8));

TEST(CudaOptim, AdamWAndClipping) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t n = 100003;
  Tensor v = randn(rng, {n}, 1e-3);
  for (int64_t i = 0; i < n; ++i) v.f32()[i] = std::abs(v.f32()[i]);  // second moments >= 0
  std::vector<In> ins = {{randn(rng, {n}), false},
                         {randn(rng, {n}), false},
                         {randn(rng, {n}, 1e-2), false},
                         {v, false}};
  const ops::AdamWParams ap{.lr = 1e-2f, .weight_decay = 0.1f, .step = 7};
  run_case(
      "adamw+clip", ins, {"param", "m", "v", "grad", "norm"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor prm = like(c, in[0]), g = like(c, in[1]), m = like(c, in[2]), vv = like(c, in[3]);
        Tensor norm = out(c, {1}, DType::F64);
        OP(clip_grad_norm)(c, {g}, 50.0, norm);
        OP(adamw_step)(c, ap, prm, g, m, vv);
        Tensor nt = Tensor::empty({1});
        nt.f32()[0] = static_cast<float>(read_scalar(norm));
        return {prm, m, vv, g, nt};
      },
      seed);
}

// Plain and with its SiLU (CausalConvParams::silu: backward forms the conv's output again).
TEST(CudaConv1d, VarlenForwardBackward) {
  REQUIRE_GPU();
  for (const bool silu : {false, true}) {
    const uint64_t seed = fresh_seed();
    Rng rng(seed);
    const int64_t C = 72, K = 4;
    const std::vector<int64_t> lengths = {1, 5, 130, 2, 61};  // documents shorter than the kernel
    SeqInfo seq = SeqInfo::from_lengths(lengths);
    const int64_t T = seq.tokens;
    const ops::CausalConvParams p{.tokens = T, .channels = C, .kernel = K, .silu = silu};
    std::vector<In> ins = {{seq.cu_seqlens, false},
                           {randn(rng, {T, C})},
                           {randn(rng, {C, K}, 0.5)},
                           {randn(rng, {T, C})},
                           {randn(rng, {C, K}, 1e-2), false}};
    run_case(
        silu ? "causal_conv1d silu" : "causal_conv1d", ins, {"y", "dx", "dw"},
        [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
          Tensor y = out(c, {T, C}, in[1].dtype()), dx = out(c, {T, C}, in[1].dtype());
          Tensor dw = like(c, in[4]);
          OP(causal_conv1d_forward)(c, p, in[0], in[1], in[2], y);
          OP(causal_conv1d_backward)(c, p, in[0], in[1], in[2], in[3], dx, dw);
          return {y, dx, dw};
        },
        seed);
  }
}

// The gate over T x H heads of K: g, draw and the parameter sums (over the tokens, and for
// dA_log the head's channels too) against the CPU.
void check_kda_gate(const char* name, int64_t T, int64_t H, int64_t K) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const ops::KdaGateParams p{.tokens = T, .heads = H, .head_dim = K};
  Tensor raw = randn(rng, {T, H * K}, 4.0);
  raw.f32()[5] = 25.f;  // past softplus's threshold: the identity branch
  std::vector<In> ins = {{raw},
                         {randn(rng, {H}, 0.5), false},
                         {randn(rng, {H * K}), false},
                         {randn(rng, {T, H * K}), false},
                         {randn(rng, {H}, 1e-2), false},
                         {randn(rng, {H * K}, 1e-2), false}};
  run_case(
      name, ins, {"g", "draw", "dA_log", "ddt_bias"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor g = out(c, {T, H * K}, DType::F32), draw = out(c, {T, H * K}, in[0].dtype());
        Tensor da = like(c, in[4]), db = like(c, in[5]);
        OP(kda_gate_forward)(c, p, in[0], in[1], in[2], g);
        OP(kda_gate_backward)(c, p, in[0], in[1], in[2], in[3], draw, da, db);
        return {g, draw, da, db};
      },
      seed, T* K);  // dA_log: a sum over the tokens and the head's channels
}

TEST(CudaKdaGate, ForwardBackward) {
  REQUIRE_GPU();
  // 16-byte packs of channels (K a multiple of the pack).
  check_kda_gate("kda_gate", 211, 4, 32);
}

TEST(CudaKdaGate, OddHeadDimTakesSingleChannels) {
  REQUIRE_GPU();
  // K = 13: no pack fits a head, one channel per thread; more rows than one chunk of partials.
  check_kda_gate("kda_gate_odd", 1500, 3, 13);
}

// T targets below V, every `every`-th from `first` ignored (-100).
Tensor ce_targets(Rng& rng, int64_t T, int64_t V, int64_t every, int64_t first) {
  Tensor tg = Tensor::empty({T}, DType::I32);
  for (int64_t t = 0; t < T; ++t)
    tg.i32()[t] = t % every == first ? -100 : static_cast<int32_t>(rng.below(V));
  return tg;
}

TEST(CudaCrossEntropy, ChunkedLmHeadWithIgnoredTargets) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t T = 300, D = 96, V = 1000;
  const ops::CrossEntropyParams p{.tokens = T, .hidden = D, .vocab = V, .chunk_tokens = 128};
  std::vector<In> ins = {{ce_targets(rng, T, V, 7, 3), false},
                         {randn(rng, {T, D})},
                         {randn(rng, {V, D}, 0.2)},
                         {randn(rng, {V, D}, 1e-2), false}};
  run_case(
      "lm_head+cross_entropy", ins, {"loss", "lse", "dh", "dw"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor lse = out(c, {T}, DType::F32), dh = out(c, {T, D}, in[1].dtype());
        Tensor dw = like(c, in[3]);
        Tensor loss = out(c, {1}, DType::F64);
        OP(lm_head_cross_entropy_forward)(c, p, in[1], in[2], in[0], lse, loss);
        OP(lm_head_cross_entropy_backward)(c, p, in[1], in[2], in[0], lse, 1.5f, dh, dw);
        Tensor l = Tensor::empty({1});
        l.f32()[0] = static_cast<float>(read_scalar(loss));
        return {l, lse, dh, dw};
      },
      seed);
}

// The one-pass form (a Train forward of a frozen head) against the CPU's two passes, and on the
// GPU against its own two passes: the same dlogits floats reach the same GEMM, so dh is
// bit-identical (the loss sums rows by atomics in either: equal to rounding).
TEST(CudaCrossEntropy, ForwardBackwardInOnePassEqualsTwo) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const int64_t T = 300, D = 96, V = 1000;
  const ops::CrossEntropyParams p{.tokens = T, .hidden = D, .vocab = V, .chunk_tokens = 128};
  std::vector<In> ins = {
      {ce_targets(rng, T, V, 5, 1), false}, {randn(rng, {T, D})}, {randn(rng, {V, D}, 0.2)}};
  std::vector<std::vector<double>> fused_gpu, split_gpu;
  run_case(
      "lm_head+cross_entropy one pass", ins, {"loss", "lse", "dh"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        Tensor lse = out(c, {T}, DType::F32), dh = out(c, {T, D}, in[1].dtype());
        Tensor loss = out(c, {1}, DType::F64);
        OP(lm_head_cross_entropy_forward_backward)(c, p, in[1], in[2], in[0], 0.7f, lse, loss, dh);
        if (gpu) {
          Tensor lse2 = out(c, {T}, DType::F32), dh2 = out(c, {T, D}, in[1].dtype()), none;
          Tensor loss2 = out(c, {1}, DType::F64);
          ops::lm_head_cross_entropy_forward(c, p, in[1], in[2], in[0], lse2, loss2);
          ops::lm_head_cross_entropy_backward(c, p, in[1], in[2], in[0], lse2, 0.7f, dh2, none);
          c.synchronize();
          fused_gpu.push_back(to_dvec(dh));
          fused_gpu.push_back(to_dvec(lse));
          split_gpu.push_back(to_dvec(dh2));
          split_gpu.push_back(to_dvec(lse2));
          EXPECT_NEAR(read_scalar(loss), read_scalar(loss2), 1e-12 * std::abs(read_scalar(loss2)));
        }
        Tensor l = Tensor::empty({1});
        l.f32()[0] = static_cast<float>(read_scalar(loss));
        return {l, lse, dh};
      },
      seed);
  EXPECT_EQ(fused_gpu, split_gpu) << "seed " << seed;
}

}  // namespace
}  // namespace mt::test
