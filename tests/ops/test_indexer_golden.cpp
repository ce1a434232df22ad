// The indexer's scores, KL loss and gradients against an external reference: PyTorch autograd in
// float64 over the published formulas (tools/make_indexer_golden.py wrote
// tests/ops/golden/indexer.safetensors; torch is not needed here). The double references of
// test_indexer.cpp share this engine's authors; this golden does not.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "io/safetensors.h"
#include "ops/indexer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// The first tests/ops/golden walking up from the working directory (ctest runs in build/tests).
fs::path golden_file() {
  std::error_code ec;
  for (fs::path p = fs::current_path(); !p.empty(); p = p.parent_path()) {
    if (fs::is_regular_file(p / "tests/ops/golden/indexer.safetensors", ec))
      return p / "tests/ops/golden/indexer.safetensors";
    if (p == p.parent_path()) break;
  }
  return {};
}

// max |a - b| / max |b|: the error relative to the reference's scale.
double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a.f32()[i]) - b.f32()[i]));
    den = std::max(den, std::abs(static_cast<double>(b.f32()[i])));
  }
  return num / std::max(den, 1e-30);
}

void check_case(const std::string& name) {
  SCOPED_TRACE(name);
  const fs::path file = golden_file();
  ASSERT_FALSE(file.empty()) << "tests/ops/golden/indexer.safetensors not found above "
                             << fs::current_path();
  const SafetensorsData g = read_safetensors(file.string());
  auto at = [&](const std::string& k) -> const Tensor& { return g.tensors.at(name + "." + k); };
  const Tensor &q = at("q"), &k = at("k"), &w = at("w"), &target = at("target"),
               &idx = at("indices");
  const int64_t T = q.dim(0), H = q.dim(1), D = q.dim(2), K = idx.dim(1);
  ops::IndexerParams p{.tokens = T, .heads = H, .head_dim = D, .kmax = K};
  Context ctx(ContextOptions{.threads = 2});

  Tensor scores = Tensor::empty({T, K}), sm = Tensor::empty({T, K});
  Tensor loss = Tensor::empty({1}, DType::F64);
  ops::indexer_scores_forward(ctx, p, q, k, w, idx, scores);
  ops::indexer_kl_forward(ctx, scores, target, idx, sm, loss);
  Tensor ds = Tensor::empty({T, K}), dq = Tensor::empty({T, H, D}), dk = Tensor::empty({T, D}),
         dw = Tensor::empty({T, H});
  ops::indexer_kl_backward(ctx, sm, target, idx, 1.0, ds);
  ops::indexer_scores_backward(ctx, p, q, k, w, idx, ds, dq, dk, dw);

  // fp32 kernels against float64 autograd: sums of a few hundred terms of O(1) values.
  EXPECT_LT(rel_err(scores, at("scores")), 1e-5);
  const double want = at("loss").f32()[0];
  EXPECT_NEAR(loss.f64()[0], want, 1e-5 * std::abs(want));
  EXPECT_LT(rel_err(dq, at("dq")), 1e-4);
  EXPECT_LT(rel_err(dk, at("dk")), 1e-4);
  EXPECT_LT(rel_err(dw, at("dw")), 1e-4);
}

TEST(IndexerGolden, DenseCausalTableMatchesTorchAutograd) {
  check_case("dense");
}

TEST(IndexerGolden, SparseTableWithEmptyRowsMatchesTorchAutograd) {
  check_case("sparse");
}

}  // namespace
}  // namespace mt
