#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "core/seq_info.h"
#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/kda.h"
#include "ops/kda_chunk_layout.h"
#include "ops/kda_gate.h"
#include "ops/kda_prep_path.h"
#include "ref/kda_ref.h"

namespace mt::test {
namespace {

// ------------------------------------------------------------------------------------------------
// Gate.

class KdaGateCase : public OpCase {
 public:
  KdaGateCase(int64_t tokens, int64_t heads, int64_t head_dim, double raw_scale)
      : p_{tokens, heads, head_dim}, raw_scale_(raw_scale) {}
  std::string name() const override {
    return cat("kda_gate T", p_.tokens, " H", p_.heads, " K", p_.head_dim);
  }
  std::vector<InputSpec> inputs() const override {
    const int64_t n = p_.heads * p_.head_dim;
    return {{.name = "raw", .shape = {p_.tokens, n}, .scale = raw_scale_},
            {.name = "A_log",
             .shape = {p_.heads},
             .accumulate = true,
             .init =
                 [](Rng& rng, Tensor& t) {
                   for (int64_t i = 0; i < t.numel(); ++i)
                     t.f32()[i] = static_cast<float>(std::log(rng.uniform(1.0, 16.0)));
                 }},
            {.name = "dt_bias", .shape = {n}, .accumulate = true, .scale = 0.5}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"g"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor g = alloc(in[0].shape());
    ops::kda_gate_forward(ctx, p_, in[0], in[1], in[2], g);
    return {g};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::kda_gate_backward(ctx, p_, in[0], in[1], in[2], dout[0], grads[0], grads[1], grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::kda_gate(in[0], in[1], in[2], p_.heads, p_.head_dim)};
  }

 private:
  ops::KdaGateParams p_;
  double raw_scale_;
};

TEST(KdaGate, Basic) {
  KdaGateCase c(37, 3, 24, 2.0);
  check_op(c);
}

// Pre-activations far beyond softplus's threshold of 20 (the identity branch).
TEST(KdaGate, SoftplusThreshold) {
  KdaGateCase c(29, 2, 5, 25.0);
  check_op(c);
}

TEST(KdaGate, ShapeMismatchIsAnError) {
  Context ctx;
  ops::KdaGateParams p{4, 2, 3};
  Tensor raw = Tensor::zeros({4, 6}), a = Tensor::zeros({3}), dt = Tensor::zeros({6}),
         g = Tensor::zeros({4, 6});
  EXPECT_THROW(ops::kda_gate_forward(ctx, p, raw, a, dt, g), ShapeError);
}

// ------------------------------------------------------------------------------------------------
// Core.

// Unit-norm key rows (as the layer feeds them), so the delta rule is a contraction.
void init_unit_rows(Rng& rng, Tensor& t) {
  const int64_t K = t.dim(-1), rows = t.numel() / K;
  float* p = t.f32();
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t i = 0; i < K; ++i) {
      p[r * K + i] = static_cast<float>(rng.normal());
      s += double(p[r * K + i]) * p[r * K + i];
    }
    for (int64_t i = 0; i < K; ++i) p[r * K + i] = static_cast<float>(p[r * K + i] / std::sqrt(s));
  }
}

// log-sigmoid of shifted normals: mostly mild decays (state survives across chunks), some strong.
void init_log_decay(Rng& rng, Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double z = 1.5 * rng.normal() + 2.0;
    t.f32()[i] = static_cast<float>(-std::log1p(std::exp(-z)));
  }
}

// Decays as the layer's gate can produce them: -exp(A) softplus(u) with exp(A) up to 16 and u
// up to a few, so single-token log decays reach -100 and in-chunk cumsums go to the thousands.
void init_strong_decay(Rng& rng, Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] =
        static_cast<float>(-rng.uniform(1.0, 16.0) * ref::softplus(2.0 * rng.normal() + 1.0));
}

void init_beta(Rng& rng, Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = static_cast<float>(ref::sigmoid(rng.normal()));
}

struct KdaSetup {
  std::vector<int64_t> lengths;
  int64_t heads = 3, head_k = 16, head_v = 24;
  bool chunked = true;
  int64_t chunk = 64;
  bool h0 = true;
  bool strong_decay = false;
};

SeqInfo seq_of(const KdaSetup& s) {
  return SeqInfo::from_lengths(s.lengths);
}

ops::KdaParams params_of(const KdaSetup& s, const SeqInfo& seq) {
  return {.tokens = seq.tokens,
          .heads = s.heads,
          .head_k = s.head_k,
          .head_v = s.head_v,
          .num_seqs = seq.num_seqs,
          .chunked = s.chunked,
          .chunk = s.chunk};
}

class KdaCase : public OpCase {
 public:
  explicit KdaCase(KdaSetup s) : s_(std::move(s)), seq_(seq_of(s_)), p_(params_of(s_, seq_)) {}
  std::string name() const override {
    std::string l;
    for (int64_t x : s_.lengths) l += cat(x, ",");
    return cat("kda ", s_.chunked ? cat("chunked(", s_.chunk, ")") : std::string("recurrent"),
               " docs[", l, "] H", s_.heads, " K", s_.head_k, " V", s_.head_v, s_.h0 ? " h0" : "");
  }
  std::vector<InputSpec> inputs() const override {
    const int64_t T = seq_.tokens, H = s_.heads, K = s_.head_k, V = s_.head_v;
    std::vector<InputSpec> in = {
        {.name = "q", .shape = {T, H, K}},
        {.name = "k", .shape = {T, H, K}, .init = init_unit_rows},
        {.name = "v", .shape = {T, H, V}},
        {.name = "g",
         .shape = {T, H, K},
         .init = s_.strong_decay ? init_strong_decay : init_log_decay},
        {.name = "beta", .shape = {T, H}, .init = init_beta},
    };
    if (s_.h0) in.push_back({.name = "h0", .shape = {seq_.num_seqs, H, K, V}, .scale = 0.5});
    return in;
  }
  std::vector<OutputSpec> outputs() const override { return {{"o"}, {"hT"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor o = alloc({seq_.tokens, s_.heads, s_.head_v});
    Tensor hT = alloc({seq_.num_seqs, s_.heads, s_.head_k, s_.head_v});
    saved_ = alloc({ops::kda_saved_rows(p_, seq_.cu_seqlens), s_.heads, s_.head_k, s_.head_v});
    ops::kda_forward(ctx, p_, on_device(ctx, seq_.cu_seqlens), in[0], in[1], in[2], in[3], in[4],
                     h0(in), o, hT, saved_, no_prepared_);
    return {o, hT};
  }
  void backward(Context& ctx, GuardedAlloc& alloc, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    Tensor dh0 = s_.h0 ? grads[5] : alloc({seq_.num_seqs, s_.heads, s_.head_k, s_.head_v});
    ops::kda_backward(ctx, p_, on_device(ctx, seq_.cu_seqlens), in[0], in[1], in[2], in[3], in[4],
                      saved_, no_prepared_, dout[0], dout[1], grads[0], grads[1], grads[2],
                      grads[3], grads[4], dh0);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    ref::KdaDims d{
        .heads = s_.heads, .head_k = s_.head_k, .head_v = s_.head_v, .offsets = seq_.offsets};
    auto [o, hT] = ref::kda(d, in[0], in[1], in[2], in[3], in[4], s_.h0 ? in[5] : DVec{});
    return {o, hT};
  }

 private:
  Tensor h0(const std::vector<Tensor>& in) const { return s_.h0 ? in[5] : Tensor(); }
  KdaSetup s_;
  SeqInfo seq_;
  ops::KdaParams p_;
  Tensor saved_;
  Tensor no_prepared_;  // the CPU ignores it; tests/cuda/test_cuda_kda.cpp passes one
};

CheckOptions kda_tol() {
  CheckOptions o;
  o.fwd_rtol = 1e-5;
  o.grad_rtol = 1e-5;
  return o;
}

TEST(Kda, RecurrentT67) {
  KdaCase c({.lengths = {67}, .chunked = false});
  check_op(c, kda_tol());
}

TEST(Kda, RecurrentDocs) {
  KdaCase c({.lengths = {67, 1, 64, 30}, .chunked = false});
  check_op(c, kda_tol());
}

TEST(Kda, ChunkedT67) {
  KdaCase c({.lengths = {67}});
  check_op(c, kda_tol());
}

TEST(Kda, ChunkedT130NoInitialState) {
  KdaCase c({.lengths = {130}, .h0 = false});
  check_op(c, kda_tol());
}

TEST(Kda, ChunkedDocs) {
  KdaCase c({.lengths = {67, 1, 64, 30}});
  check_op(c, kda_tol());
}

// Many chunk boundaries per document, K > V.
TEST(Kda, ChunkedSmallChunk) {
  KdaCase c({.lengths = {19, 5, 33}, .heads = 2, .head_k = 20, .head_v = 12, .chunk = 8});
  check_op(c, kda_tol());
}

TEST(Kda, ChunkedStrongDecay) {
  KdaCase c({.lengths = {67, 30}, .strong_decay = true});
  check_op(c, kda_tol());
}

TEST(Kda, RecurrentStrongDecay) {
  KdaCase c({.lengths = {67, 30}, .chunked = false, .strong_decay = true});
  check_op(c, kda_tol());
}

// The chunked form against the recurrence on the same inputs: outputs and every gradient.
void chunked_matches_recurrent(bool strong_decay) {
  const std::vector<int64_t> lengths = {67, 1, 64, 30, 130};
  const int64_t H = 3, K = 32, V = 24;
  SeqInfo seq = SeqInfo::from_lengths(lengths);
  const int64_t T = seq.tokens, N = seq.num_seqs;
  Rng rng(test_seed());
  Tensor q = Tensor::empty({T, H, K}), k = Tensor::empty({T, H, K}), v = Tensor::empty({T, H, V}),
         g = Tensor::empty({T, H, K}), beta = Tensor::empty({T, H}),
         h0 = Tensor::empty({N, H, K, V}), dout = Tensor::empty({T, H, V}),
         dhT = Tensor::empty({N, H, K, V});
  fill_normal(rng, q);
  init_unit_rows(rng, k);
  fill_normal(rng, v);
  (strong_decay ? init_strong_decay : init_log_decay)(rng, g);
  init_beta(rng, beta);
  fill_normal(rng, h0, 0.5);
  fill_normal(rng, dout);
  fill_normal(rng, dhT);

  struct Result {
    Tensor o, hT, dq, dk, dv, dg, dbeta, dh0;
  };
  auto run = [&](bool chunked) {
    Context ctx;
    ops::KdaParams p{
        .tokens = T, .heads = H, .head_k = K, .head_v = V, .num_seqs = N, .chunked = chunked};
    Result r{Tensor::empty({T, H, V}),    Tensor::empty({N, H, K, V}), Tensor::empty(q.shape()),
             Tensor::empty(k.shape()),    Tensor::empty(v.shape()),    Tensor::empty(g.shape()),
             Tensor::empty(beta.shape()), Tensor::empty(h0.shape())};
    Tensor saved = Tensor::empty({ops::kda_saved_rows(p, seq.cu_seqlens), H, K, V});
    Tensor no_prepared;
    ops::kda_forward(ctx, p, seq.cu_seqlens, q, k, v, g, beta, h0, r.o, r.hT, saved, no_prepared);
    ops::kda_backward(ctx, p, seq.cu_seqlens, q, k, v, g, beta, saved, no_prepared, dout, dhT, r.dq,
                      r.dk, r.dv, r.dg, r.dbeta, r.dh0);
    return r;
  };
  Result a = run(true), b = run(false);
  auto cmp = [](const Tensor& x, const Tensor& y, const char* what) {
    EXPECT_LE(rel_err(to_dvec(x), to_dvec(y)), 1e-5) << what;
  };
  cmp(a.o, b.o, "o");
  cmp(a.hT, b.hT, "hT");
  cmp(a.dq, b.dq, "dq");
  cmp(a.dk, b.dk, "dk");
  cmp(a.dv, b.dv, "dv");
  cmp(a.dg, b.dg, "dg");
  cmp(a.dbeta, b.dbeta, "dbeta");
  cmp(a.dh0, b.dh0, "dh0");
}

TEST(Kda, ChunkedMatchesRecurrent) {
  chunked_matches_recurrent(false);
}

TEST(Kda, ChunkedMatchesRecurrentStrongDecay) {
  chunked_matches_recurrent(true);
}

// The chunk states' dtype (ops/kda_prep_path.h): bf16 exactly where the bf16 prepared layout runs
// (bf16 tensors, the chunked form at chunk 64, head dims 64 or 128, the choices on) and only on
// the GPU, with KdaKernels::bf16_states; f32 everywhere else. The layer's default keeps no
// prepared blocks. Plain arithmetic on the host: the entries and the layer read the same rule.
TEST(KdaSavedDtype, Bf16StatesOnlyWhereTheBf16LayoutRunsOnTheGpu) {
  EXPECT_FALSE(ops::KdaKernels{}.keep_prepared) << "the default keeps the prepared blocks";
  EXPECT_TRUE(ops::KdaKernels{}.bf16_states) << "the default keeps fp32 chunk states";
  for (const int64_t K : {32, 64, 128})
    for (const int64_t C : {32, 64})
      for (const bool chunked : {false, true})
        for (const DType dt : {DType::F32, DType::BF16})
          for (const int switches : {0, 1, 2, 3}) {
            const bool bf16_states = switches & 1, tensor_cores = switches & 2;
            SCOPED_TRACE(cat("K ", K, " C ", C, " chunked ", chunked, " ", dtype_name(dt),
                             " bf16 states ", bf16_states, " tensor cores ", tensor_cores));
            ops::KdaParams p{.tokens = 200,
                             .heads = 2,
                             .head_k = K,
                             .head_v = K,
                             .num_seqs = 2,
                             .chunked = chunked,
                             .chunk = C};
            p.kernels.bf16_states = bf16_states;
            p.kernels.tensor_core_prep = tensor_cores;
            const bool fits = chunked && C == 64 && K != 32 && dt == DType::BF16 && tensor_cores;
            EXPECT_EQ(ops::kda_bf16_states_fit(p, dt), fits);
            EXPECT_EQ(ops::kda_bf16_states_fit(p, dt), ops::kda_chunk_layout(p, dt).half);
            EXPECT_EQ(ops::kda_saved_dtype(Device::CUDA, p, dt),
                      fits && bf16_states ? DType::BF16 : DType::F32);
            EXPECT_EQ(ops::kda_saved_dtype(Device::CPU, p, dt), DType::F32);
          }
}

// The job key kernels.kda's form: "default", or name=on|off joined by ':' for every field of
// ops::KdaKernels; the name lists the choices that differ from the defaults, in the fields'
// order, and parses back to the same choices. Bad parts are refused with the part named.
TEST(KdaKernels, NamesParseBackAndBadPartsAreRefused) {
  EXPECT_EQ(ops::parse_kda_kernels("default"), ops::KdaKernels{});
  EXPECT_EQ(ops::kda_kernels_name(ops::KdaKernels{}), "default");
  const ops::KdaKernels k = ops::parse_kda_kernels("grads_v2=off:forward_overlap_waves=on");
  EXPECT_FALSE(k.grads_v2);
  EXPECT_TRUE(k.forward_overlap_waves);
  ops::KdaKernels expected;
  expected.grads_v2 = false;
  expected.forward_overlap_waves = true;
  EXPECT_EQ(k, expected);
  EXPECT_EQ(ops::kda_kernels_name(k), "forward_overlap_waves=on:grads_v2=off");
  // Every field, flipped alone: named, and read back.
  const std::string names[] = {"chunk_kernels",
                               "tensor_core_prep",
                               "bf16_prepared",
                               "bf16_states",
                               "keep_prepared",
                               "fused_delta",
                               "fused_pre",
                               "prep_v2",
                               "forward_state_v2",
                               "forward_overlap",
                               "forward_overlap_waves",
                               "forward_longest_first",
                               "backward_state_v2",
                               "grads_v2",
                               "products_v2",
                               "products_prefetch"};
  std::set<std::string> seen;
  for (const std::string& n : names) {
    const ops::KdaKernels on = ops::parse_kda_kernels(n + "=on"),
                          off = ops::parse_kda_kernels(n + "=off");
    EXPECT_NE(on, off) << n;
    const std::string flipped = on == ops::KdaKernels{} ? n + "=off" : n + "=on";
    EXPECT_EQ(ops::kda_kernels_name(ops::parse_kda_kernels(flipped)), flipped);
    seen.insert(ops::kda_kernels_name(ops::parse_kda_kernels(flipped)));
  }
  EXPECT_EQ(seen.size(), std::size(names));
  // Setting a choice to its default leaves the default.
  EXPECT_EQ(ops::kda_kernels_name(ops::parse_kda_kernels("grads_v2=on")), "default");
  for (const char* bad : {"", "grads_v3=off", "grads_v2", "grads_v2=no",
                          "grads_v2=off:", "grads_v2=off::prep_v2=off", "Default"}) {
    try {
      ops::parse_kda_kernels(bad);
      ADD_FAILURE() << "\"" << bad << "\" was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("KDA kernels"), std::string::npos) << e.what();
    }
  }
}

TEST(Kda, BadCuSeqlensIsAnError) {
  Context ctx;
  SeqInfo seq = SeqInfo::from_lengths({3, 4});
  ops::KdaParams p{.tokens = 8, .heads = 1, .head_k = 2, .head_v = 2, .num_seqs = 2};
  EXPECT_THROW(ops::kda_saved_rows(p, seq.cu_seqlens), ValueError);
  p.tokens = 7;
  Tensor q = Tensor::zeros({7, 1, 2}), v = Tensor::zeros({7, 1, 3}), beta = Tensor::zeros({7, 1}),
         o = Tensor::zeros({7, 1, 2}), saved = Tensor::zeros({2, 1, 2, 2});
  Tensor none;
  EXPECT_THROW(
      ops::kda_forward(ctx, p, seq.cu_seqlens, q, q, v, q, beta, none, o, none, saved, none),
      ShapeError);
}

// The CUDA chunked kernels' prepared block (ops/kda_chunk_layout.h), in both layouts: bf16 slots
// exactly where the bf16 tensor-core path runs (bf16 tensors, chunk 64, head dims 64 or 128,
// both choices on), the slots tiling the block without overlap, backward's fp32 products and dbeta
// shares inside what backward may overwrite (below Aqk, or W .. Kb's fp32 places), and
// kda_prepared_floats and the workspace count following the layout. Plain arithmetic on the
// host: the kernels read the same struct.
TEST(KdaChunkLayout, Bf16SlotsOnlyOnTheTensorCorePathAndSlotsTileTheBlock) {
  for (const int64_t K : {16, 64, 128})
    for (const int64_t V : {32, 64, 128})
      for (const int64_t C : {16, 64})
        for (const DType dt : {DType::F32, DType::BF16})
          for (const int switches : {0, 1, 2, 3}) {
            const bool switch_on = switches & 1, bf16_on = switches & 2;
            SCOPED_TRACE(cat("K ", K, " V ", V, " C ", C, " ", dtype_name(dt), " tensor cores ",
                             switch_on, " bf16 prepared ", bf16_on));
            ops::KdaParams p{
                .tokens = 200, .heads = 3, .head_k = K, .head_v = V, .num_seqs = 2, .chunk = C};
            p.kernels.tensor_core_prep = switch_on;
            p.kernels.bf16_prepared = bf16_on;
            const ops::KdaChunkLayout lay = ops::kda_chunk_layout(p, dt);
            const bool tc = dt == DType::BF16 && switch_on && bf16_on && C == 64 &&
                            (K == 64 || K == 128) && (V == 64 || V == 128);
            EXPECT_EQ(lay.half, tc);
            // Slots in order, in floats: bf16 slots take half as many.
            const int64_t s = tc ? 2 : 1;
            const std::vector<std::pair<int64_t, int64_t>> slots = {
                {lay.W(), C * K / s}, {lay.Qh(), C * K / s}, {lay.Kl(), C * K / s},
                {lay.U(), C * V / s}, {lay.Kb(), C * K / s}, {lay.Aqk(), C * C},
                {lay.Tm(), C * C},    {lay.KK(), C * C},     {lay.gL(), K}};
            int64_t at = 0;
            for (const auto& [start, n] : slots) {
              EXPECT_EQ(start, at);
              at += n;
            }
            EXPECT_EQ(lay.block(), at);
            if (tc) {
              EXPECT_EQ(lay.block(), 2 * C * K + C * V / 2 + 3 * C * C + K);
            }
            // Backward's products: dO S0^T and dR S0^T (fp32 [C, K] each), then the two dbeta
            // shares of C floats, all in the part of the block backward no longer reads.
            EXPECT_EQ(lay.dOS0(), 0);
            EXPECT_EQ(lay.dRS0(), C * K);
            EXPECT_GE(lay.dbeta_parts(), lay.dRS0() + C * K);
            EXPECT_LE(lay.dbeta_parts() + 2 * C, tc ? lay.Aqk() : lay.Kb());
            // fp32: Delta dS^T in Kl's place; bf16: in the outgoing-dS slot, which holds it.
            if (tc) {
              EXPECT_GE(K * V, C * K);
            } else {
              EXPECT_EQ(lay.Kl(), 2 * C * K);
            }
            // The planner's counts follow the layout.
            EXPECT_EQ(ops::kda_prepared_floats(p, 5, dt), 5 * p.heads * lay.block());
            const int64_t kept_fwd = ops::kda_chunk_workspace_floats(p, 5, false, true, dt);
            EXPECT_EQ(ops::kda_chunk_workspace_floats(p, 5, false, false, dt),
                      kept_fwd + 5 * p.heads * lay.block());
            EXPECT_EQ(ops::kda_chunk_workspace_floats(p, 5, true, true, dt),
                      kept_fwd + 5 * p.heads * (2 * C * V + K * V));
          }
  // At the benchmark shape the bf16 block is 132 KB in place of 213 KB.
  const ops::KdaParams p{.tokens = 64, .heads = 1, .head_k = 128, .head_v = 128, .num_seqs = 1};
  EXPECT_EQ(ops::kda_chunk_layout(p, DType::BF16).block() * 4, 131584);
  EXPECT_EQ(ops::kda_chunk_layout(p, DType::F32).block() * 4, 213504);
}

}  // namespace
}  // namespace mt::test
