// Our chunked KDA core against fla 0.6.0's chunk_kda on the same inputs at a benchmark shape (issue
// 12: speed must never be bought with accuracy). `bench/kda_fla.py --dump FILE` writes the inputs
// (bf16 values; g and beta too, so both sides read the same numbers), fla's output and gradients,
// and the output of a float64 token-by-token recurrence run by torch on the same inputs;
// MOETRAIN_FLA_KDA names that file. Without it the test skips (the device call runs the pair).
// Both implementations are measured against the float64 output, and against each other for
// every gradient, each relative error printed for bench/RESULTS.md.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/error.h"
#include "core/seq_info.h"
#include "harness/gpu_check.h"
#include "harness/op_check.h"
#include "io/safetensors.h"
#include "ops/kda.h"
#include "ops/kda_prep_path.h"

namespace mt::test {
namespace {

// Two bf16 computations of the same quantity differ by a few bf16 roundings (2^-8 each) summed
// over 64-token chunks and 128-wide dot products; 2% is ~5x what they show when both are right,
// and far below what a wrong term (a missing decay, a transposed block) gives.
constexpr double kAgainstFla = 2e-2;

const Tensor& named(const SafetensorsData& d, const std::string& file, const std::string& name) {
  const auto it = d.tensors.find(name);
  MT_CHECK(it != d.tensors.end(), ValueError, file, ": no tensor \"", name,
           "\" (written by bench/kda_fla.py --dump)");
  return it->second;
}

Tensor device_as(const Tensor& host_f32, DType dt) {
  Tensor t = Tensor::empty(host_f32.shape(), dt);
  t.copy_from(host_f32);
  return t.to(Device::CUDA);
}

TEST(CudaKdaFla, SameInputsAsFlaChunkKda) {
  REQUIRE_GPU();
  const char* path = std::getenv("MOETRAIN_FLA_KDA");
  if (path == nullptr) GTEST_SKIP() << "MOETRAIN_FLA_KDA unset (bench/kda_fla.py --dump writes it)";
  const SafetensorsData d = read_safetensors(path);
  const auto get = [&](const std::string& n) -> const Tensor& { return named(d, path, n); };
  const Tensor& q_h = get("q");
  ASSERT_EQ(q_h.ndim(), 3) << "q [T, H, K]";
  const int64_t T = q_h.dim(0), H = q_h.dim(1), K = q_h.dim(2), V = get("v").dim(2);
  const Tensor& cu_h = get("cu_seqlens");
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n + 1 < cu_h.numel(); ++n)
    lengths.push_back(cu_h.i32()[n + 1] - cu_h.i32()[n]);
  const SeqInfo seq = SeqInfo::from_lengths(lengths);
  ASSERT_EQ(seq.tokens, T) << "cu_seqlens against q";

  Context ctx(ContextOptions{.device = Device::CUDA, .workspace_bytes = size_t(4) << 30});
  const ops::KdaParams p{
      .tokens = T, .heads = H, .head_k = K, .head_v = V, .num_seqs = seq.num_seqs};
  const DType bf = DType::BF16, f32 = DType::F32;
  const Tensor q = device_as(q_h, bf), k = device_as(get("k"), bf), v = device_as(get("v"), bf),
               g = device_as(get("g"), f32), beta = device_as(get("beta"), f32),
               dout = device_as(get("do"), bf), cu = seq.cu_seqlens.to(Device::CUDA);
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  const auto on_device = [](const Shape& s, DType dt) {
    return Tensor::empty(s, dt, Device::CUDA);
  };
  // What forward keeps for backward as the KDA layer keeps it (ops/kda_prep_path.h): the chunk
  // states in kda_saved_dtype (bf16), the prepared blocks only with p.kernels.keep_prepared.
  Tensor o = on_device({T, H, V}, bf), none,
         saved = on_device({rows, H, K, V}, ops::kda_saved_dtype(Device::CUDA, p, bf)),
         prepared = p.kernels.keep_prepared
                        ? on_device({ops::kda_prepared_floats(p, rows, bf)}, f32)
                        : Tensor();
  Tensor dq = on_device(q.shape(), bf), dk = on_device(k.shape(), bf),
         dv = on_device(v.shape(), bf), dg = on_device(g.shape(), f32),
         dbeta = on_device(beta.shape(), f32);
  ops::kda_forward(ctx, p, cu, q, k, v, g, beta, Tensor(), o, none, saved, prepared);
  ops::kda_backward(ctx, p, cu, q, k, v, g, beta, saved, prepared, dout, Tensor(), dq, dk, dv, dg,
                    dbeta, none);

  const DVec o64 = to_dvec(get("o_fp64"));
  const double ours_o = rel_err(to_dvec(o), o64), fla_o = rel_err(to_dvec(get("fla_o")), o64);
  std::printf(
      "  kda vs fla, T %lld H %lld K %lld, %lld documents: o against float64: ours %.3g, fla "
      "%.3g\n",
      static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(K),
      static_cast<long long>(seq.num_seqs), ours_o, fla_o);
  EXPECT_LE(ours_o, kAgainstFla);
  const std::vector<std::pair<std::string, const Tensor*>> ours = {
      {"o", &o}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dg", &dg}, {"dbeta", &dbeta}};
  for (const auto& [name, t] : ours) {
    const double e = rel_err(to_dvec(*t), to_dvec(get("fla_" + name)));
    std::printf("  kda vs fla: %-6s ours against fla's, relative %.3g\n", name.c_str(), e);
    EXPECT_LE(e, kAgainstFla) << name;
  }
}

}  // namespace
}  // namespace mt::test
