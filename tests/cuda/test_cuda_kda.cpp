// The KDA core on the GPU against the CPU engine (harness/gpu_check.h): both algorithms, packed
// documents whose lengths straddle the chunk (1, C - 1, C, C + 1, > 3 C), with and without an
// initial state and a final-state gradient, head dims 64, 128 and a small odd one. Every output
// is compared, `saved` included: the CPU and the GPU must agree on what it holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>

#include "core/seq_info.h"
#include "cuda/kda_inputs.h"
#include "harness/gpu_check.h"
#include "harness/op_check.h"
#include "ops/kda.h"
#include "ops/kda_prep_path.h"
#include "ref/activation_ref.h"

namespace mt::test {
namespace {

struct KdaGpuSetup {
  bool chunked = true;
  int64_t head_k = 64, head_v = 64, chunk = 64;
  bool h0 = true, dhT = true;
  bool strong_decay = false;
};

std::string setup_name(const KdaGpuSetup& s) {
  return std::string(s.chunked ? "Chunked" + std::to_string(s.chunk) : "Recurrent") + "_K" +
         std::to_string(s.head_k) + "V" + std::to_string(s.head_v) + (s.h0 ? "_h0" : "_zeroState") +
         (s.dhT ? "_dhT" : "_noDhT") + (s.strong_decay ? "_strongDecay" : "");
}

void PrintTo(const KdaGpuSetup& s, std::ostream* os) {
  *os << setup_name(s);
}

class CudaKda : public ::testing::TestWithParam<KdaGpuSetup> {};

TEST_P(CudaKda, ForwardBackward) {
  REQUIRE_GPU();
  const KdaGpuSetup s = GetParam();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const SeqInfo seq = SeqInfo::from_lengths({1, 63, 64, 65, 200});
  const int64_t T = seq.tokens, N = seq.num_seqs, H = 2, K = s.head_k, V = s.head_v;
  const ops::KdaParams p{.tokens = T,
                         .heads = H,
                         .head_k = K,
                         .head_v = V,
                         .num_seqs = N,
                         .chunked = s.chunked,
                         .chunk = s.chunk};
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  const std::vector<In> ins =
      kda_inputs(rng, seq.cu_seqlens, T, N, H, K, V,
                 [&](Rng& r, const Shape& sh) { return log_decay(r, sh, s.strong_decay); });
  const auto run = [&](Context& c, const std::vector<Tensor>& in, bool gpu, bool round_states) {
    return kda_forward_backward(p, rows, s.h0, s.dhT, c, in, gpu, round_states);
  };
  const bool states_bf16 = ops::kda_saved_dtype(Device::CUDA, p, DType::BF16) == DType::BF16;
  run_case(
      setup_name(s).c_str(), ins, {"o", "hT", "saved", "dq", "dk", "dv", "dg", "dbeta", "dh0"},
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) { return run(c, in, gpu, false); },
      seed, 0,
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) {
        return run(c, in, gpu, states_bf16);
      });
}

INSTANTIATE_TEST_SUITE_P(
    Kda, CudaKda,
    ::testing::Values(
        KdaGpuSetup{.chunked = true}, KdaGpuSetup{.chunked = false},
        KdaGpuSetup{.chunked = true, .head_k = 128, .head_v = 128},
        KdaGpuSetup{.chunked = false, .head_k = 128, .head_v = 128},
        KdaGpuSetup{.chunked = true, .h0 = false, .dhT = false},
        KdaGpuSetup{.chunked = false, .h0 = false, .dhT = true},
        KdaGpuSetup{.chunked = true, .h0 = true, .dhT = false},
        KdaGpuSetup{.chunked = true, .head_k = 128, .head_v = 64, .strong_decay = true},
        KdaGpuSetup{.chunked = false, .head_k = 64, .head_v = 128, .strong_decay = true},
        // A small odd head, K > V, and chunks much shorter than the documents.
        KdaGpuSetup{.chunked = true, .head_k = 13, .head_v = 7, .chunk = 16},
        KdaGpuSetup{.chunked = false, .head_k = 13, .head_v = 7},
        // The widest heads the kernel takes (one window token per pass).
        KdaGpuSetup{.chunked = true, .head_k = 256, .head_v = 256}),
    [](const ::testing::TestParamInfo<KdaGpuSetup>& pi) { return setup_name(pi.param); });

// Entries with GPU tensors reach the kernels through the public API too, with offsets and
// inputs on the device (the host checks only what it can without reading them).
TEST(CudaKdaEntry, PublicApiDispatchesToTheGpu) {
  REQUIRE_GPU();
  Rng rng(fresh_seed());
  const SeqInfo seq = SeqInfo::from_lengths({5, 70});
  const int64_t T = seq.tokens, N = seq.num_seqs, H = 1, K = 32, V = 16;
  const ops::KdaParams p{.tokens = T, .heads = H, .head_k = K, .head_v = V, .num_seqs = N};
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  Tensor q = randn(rng, {T, H, K}), k = unit_rows(rng, {T, H, K}), v = randn(rng, {T, H, V});
  Tensor g = log_decay(rng, {T, H, K}, false), beta = randn(rng, {T, H}, 0.1);
  for (int64_t i = 0; i < beta.numel(); ++i) beta.f32()[i] += 0.5f;
  Tensor o = Tensor::empty({T, H, V}), hT = Tensor::empty({N, H, K, V});
  Tensor saved = Tensor::empty({rows, H, K, V});
  Context cpu;
  Tensor none;
  ops::kda_forward(cpu, p, seq.cu_seqlens, q, k, v, g, beta, Tensor(), o, hT, saved, none);

  Context gpu(ContextOptions{.device = Device::CUDA});
  const Device D = Device::CUDA;
  Tensor go = Tensor::empty(o.shape(), DType::F32, D),
         ghT = Tensor::empty(hT.shape(), DType::F32, D);
  Tensor gsaved = Tensor::empty(saved.shape(), DType::F32, D);
  ops::kda_forward(gpu, p, seq.cu_seqlens.to(D), q.to(D), k.to(D), v.to(D), g.to(D), beta.to(D),
                   Tensor(), go, ghT, gsaved, none);
  gpu.synchronize();
  EXPECT_LE(rel_err(to_dvec(go), to_dvec(o)), 1e-5);
  EXPECT_LE(rel_err(to_dvec(ghT), to_dvec(hT)), 1e-5);
  EXPECT_LE(rel_err(to_dvec(gsaved), to_dvec(saved)), 1e-5);
  // A `saved` no documents of these tokens could fill is refused on the host.
  Tensor wrong = Tensor::empty({rows + 5, H, K, V}, DType::F32, D);
  EXPECT_THROW(ops::kda_forward(gpu, p, seq.cu_seqlens.to(D), q.to(D), k.to(D), v.to(D), g.to(D),
                                beta.to(D), Tensor(), go, ghT, wrong, none),
               ShapeError);
  // So is a prepared tensor of the wrong size.
  Tensor short_prepared =
      Tensor::empty({ops::kda_prepared_floats(p, rows, DType::F32) - 1}, DType::F32, D);
  EXPECT_THROW(ops::kda_forward(gpu, p, seq.cu_seqlens.to(D), q.to(D), k.to(D), v.to(D), g.to(D),
                                beta.to(D), Tensor(), go, ghT, gsaved, short_prepared),
               ShapeError);
}

// Backward reading the products forward left in `prepared` gives the very bits of backward
// recomputing them (the same kernel computes both), bf16 and fp32, on uneven documents.
TEST(CudaKdaPrepared, BackwardFromPreparedEqualsRecomputedBitwise) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const SeqInfo seq = SeqInfo::from_lengths({3, 64, 130, 90});
  const int64_t T = seq.tokens, N = seq.num_seqs, H = 3, K = 128, V = 64;
  // Backward's Delta by bwd_pre in both runs: where it recomputes the blocks on bf16 states it
  // would otherwise form Delta at the end of its prep (ops/kda_prep_path.h, fused_delta), in
  // another summation order than from kept blocks (CudaKdaTc compares those two).
  ops::KdaParams p{.tokens = T, .heads = H, .head_k = K, .head_v = V, .num_seqs = N};
  p.kernels.fused_delta = false;
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  const Device D = Device::CUDA;
  const Tensor beta = random_beta(rng, T, H);
  const Tensor q0 = randn(rng, {T, H, K}), k0 = unit_rows(rng, {T, H, K}),
               v0 = randn(rng, {T, H, V}), dout0 = randn(rng, {T, H, V});
  const Tensor g = log_decay(rng, {T, H, K}, false).to(D), b = beta.to(D),
               cu = seq.cu_seqlens.to(D);
  Context gpu(ContextOptions{.device = Device::CUDA});
  for (DType dt : {DType::F32, DType::BF16}) {
    const auto on_gpu = [&](const Tensor& t) {
      Tensor d = Tensor::empty(t.shape(), dt, D);
      d.copy_from(t);  // converts to bf16 where dt says so
      return d;
    };
    const Tensor q = on_gpu(q0), k = on_gpu(k0), v = on_gpu(v0), dout = on_gpu(dout0);
    std::vector<std::vector<double>> got[2];
    for (int keep = 0; keep < 2; ++keep) {
      Tensor o = Tensor::empty({T, H, V}, dt, D), none;
      Tensor saved = Tensor::empty({rows, H, K, V}, ops::kda_saved_dtype(D, p, dt), D);
      Tensor prepared =
          keep ? Tensor::empty({ops::kda_prepared_floats(p, rows, dt)}, DType::F32, D) : Tensor();
      ops::kda_forward(gpu, p, cu, q, k, v, g, b, Tensor(), o, none, saved, prepared);
      Tensor dq = Tensor::empty({T, H, K}, dt, D), dk = Tensor::empty({T, H, K}, dt, D),
             dv = Tensor::empty({T, H, V}, dt, D), dg = Tensor::empty({T, H, K}, DType::F32, D),
             dbeta = Tensor::empty({T, H}, DType::F32, D);
      ops::kda_backward(gpu, p, cu, q, k, v, g, b, saved, prepared, dout, Tensor(), dq, dk, dv, dg,
                        dbeta, none);
      gpu.synchronize();
      for (const Tensor* t : {&o, &dq, &dk, &dv, &dg, &dbeta}) got[keep].push_back(to_dvec(*t));
    }
    const char* names[] = {"o", "dq", "dk", "dv", "dg", "dbeta"};
    for (size_t i = 0; i < got[0].size(); ++i)
      EXPECT_EQ(got[0][i], got[1][i]) << names[i] << " (" << dtype_name(dt) << "), seed " << seed;
  }
}

// An evaluation forward (KdaParams::keep_for_backward false) gives the bits of a training one,
// o and the final states, and on the tensor-core path (bf16, K = V = 128) leaves the chunk states
// unwritten (the NaN fill survives): what it exists to skip.
TEST(CudaKdaEval, ForwardWithoutBackwardGivesTheSameOutputs) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const SeqInfo seq = SeqInfo::from_lengths({3, 64, 130, 90});
  const int64_t T = seq.tokens, N = seq.num_seqs, H = 3, K = 128, V = 128;
  ops::KdaParams p{.tokens = T, .heads = H, .head_k = K, .head_v = V, .num_seqs = N};
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  const Device D = Device::CUDA;
  const Tensor beta = random_beta(rng, T, H);
  const auto bf = [&](const Tensor& t) {
    Tensor d = Tensor::empty(t.shape(), DType::BF16, D);
    d.copy_from(t);
    return d;
  };
  const Tensor q = bf(randn(rng, {T, H, K})), k = bf(unit_rows(rng, {T, H, K})),
               v = bf(randn(rng, {T, H, V})), g = log_decay(rng, {T, H, K}, false).to(D),
               b = beta.to(D), h0 = randn(rng, {N, H, K, V}, 0.5).to(D), cu = seq.cu_seqlens.to(D);
  Context gpu(ContextOptions{.device = Device::CUDA});
  std::vector<double> o[2], hT[2], saved_after[2];
  for (int keep = 0; keep < 2; ++keep) {
    p.keep_for_backward = keep == 1;
    Tensor out = Tensor::empty({T, H, V}, DType::BF16, D),
           fin = Tensor::empty({N, H, K, V}, DType::F32, D), none;
    Tensor fill = Tensor::empty({rows, H, K, V});
    std::fill(fill.f32(), fill.f32() + fill.numel(), std::nanf(""));
    Tensor saved = fill.to(D);
    ops::kda_forward(gpu, p, cu, q, k, v, g, b, h0, out, fin, saved, none);
    gpu.synchronize();
    o[keep] = to_dvec(out);
    hT[keep] = to_dvec(fin);
    saved_after[keep] = to_dvec(saved);
  }
  EXPECT_EQ(o[0], o[1]) << "o, seed " << seed;
  EXPECT_EQ(hT[0], hT[1]) << "hT, seed " << seed;
  const auto nans = [](const std::vector<double>& x) {
    return std::count_if(x.begin(), x.end(), [](double e) { return std::isnan(e); });
  };
  EXPECT_EQ(nans(saved_after[0]), static_cast<int64_t>(saved_after[0].size()))
      << "the evaluation forward wrote chunk states";
  EXPECT_EQ(nans(saved_after[1]), 0) << "the training forward left chunk states unwritten";
}

}  // namespace
}  // namespace mt::test
