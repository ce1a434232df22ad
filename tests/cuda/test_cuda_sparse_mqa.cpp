// Sparse attention in the absorbed MQA form on tensor cores (ops/cuda/sparse_mqa_attention.cu:
// DeepSeek's 576-wide latent + rope entries, 512-wide values, heads as the MMA's rows in blocks
// of up to 64) against the CPU op: forward, the head-summed probabilities (the DSA KL target) and
// backward, through the harness's three passes (harness/gpu_check.h): the bf16 pass runs the
// tensor-core kernels and must stay within the bf16 row of the tolerance table; the f32 pass runs
// the composite (the direct kernels). Lists as the top-k writes them (increasing, -1 padded) and
// scattered ones with duplicates and unused slots, varlen documents, T and list lengths off the
// 32-key tile, head counts that leave padded MMA rows. Every case runs each generation of the
// kernels (ops::SparseMqaKernels: Split, Chained, the Wgmma forward's two forms, and Wgmma3, whose
// backward and prob sum are on wgmma too, up to 32 heads), each against the CPU; Wgmma and Wgmma2
// check o and lse only (their backward is Split's), Wgmma3 everything, over 64-key tiles that the
// same lists cross partially, blank and full, with padded heads at 8, 16 and 24. Split's own edges
// (one key buffer whose next gather starts mid-tile, no end-of-tile barrier) get lists of one tile,
// a second tile of one slot, and a tile with no valid slot between valid ones. Without a GPU every
// test skips, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "harness/gpu_check.h"
#include "ops/sparse_mqa_attention.h"

namespace mt::test {
namespace {

// Row t of a document starting at b: its causal keys b .. t when they fit in K slots, else K of
// them drawn without replacement, sorted, t always among them; then -1. `scatter` shuffles the
// row, turns a fifth of the slots into -1 and repeats some positions (t stays if all go).
// `blank`: slots blank .. blank + blank_len - 1 become -1 in every row (a key tile without a
// valid slot).
Tensor lists(Rng& rng, const std::vector<int64_t>& lengths, int64_t K, bool scatter,
             int64_t blank = -1, int64_t blank_len = 32) {
  int64_t T = 0;
  for (int64_t l : lengths) T += l;
  Tensor table = Tensor::empty({T, K}, DType::I32);
  int64_t b = 0;
  for (int64_t len : lengths) {
    for (int64_t t = b; t < b + len; ++t) {
      std::vector<int32_t> keys;
      for (int64_t s = b; s < t; ++s) keys.push_back(static_cast<int32_t>(s));
      for (size_t i = keys.size(); i > 1; --i)  // Fisher-Yates, then keep K - 1 and t
        std::swap(keys[i - 1], keys[static_cast<size_t>(rng.below(static_cast<int64_t>(i)))]);
      keys.resize(std::min<size_t>(keys.size(), static_cast<size_t>(K - 1)));
      keys.push_back(static_cast<int32_t>(t));
      if (!scatter) std::sort(keys.begin(), keys.end());
      keys.resize(static_cast<size_t>(K), -1);
      if (scatter)
        for (int32_t& s : keys)
          s = rng.uniform() < 0.2 ? -1 : (rng.uniform() < 0.1 ? static_cast<int32_t>(t) : s);
      if (blank >= 0)
        for (int64_t j = blank; j < std::min(K, blank + blank_len); ++j)
          keys[static_cast<size_t>(j)] = -1;
      // No empty rows here (their lse is -inf on both sides; tests/ops covers them).
      if (std::all_of(keys.begin(), keys.end(), [](int32_t s) { return s < 0; }))
        keys[0] = static_cast<int32_t>(t);
      std::copy(keys.begin(), keys.end(), table.i32() + t * K);
    }
    b += len;
  }
  return table;
}

// The backward's target against the prob-sum pass of the same run (host copies): one pass's P
// summed in the same order, so at most a rounding apart (bit for bit by construction).
void expect_same_target(const Tensor& prob, const Tensor& pb, const char* name, bool gpu,
                        DType dt) {
  const Tensor a = prob.to(Device::CPU), b = pb.to(Device::CPU);
  double worst = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.f32()[i], y = b.f32()[i], d = std::abs(x - y);
    worst = std::max(worst, d);
    bad += !(d <= 1e-6 * std::abs(x) + 1e-7);  // NaN counts
  }
  EXPECT_EQ(bad, 0) << name << (gpu ? " (GPU, " : " (CPU, ") << dtype_name(dt)
                    << "): backward's target vs sparse_mqa_prob_sum, worst |diff| " << worst;
}

// On the kernels' generation `gen` (SparseMqaParams::kernels; the CPU ignores it). forward_only: o
// and lse alone (the Wgmma generations, whose backward and prob sum are Split's:
// the rest would repeat Split's run at the cost of the CPU backward, the bulk of a case's time).
void check_one(ops::SparseMqaKernels gen, const std::string& name, int64_t H, int64_t K,
               const std::vector<int64_t>& lengths, bool scatter, int64_t blank, int64_t blank_len,
               uint64_t seed, Rng& rng, bool forward_only = false) {
  ASSERT_TRUE(ops::sparse_mqa_fits(H, 576, 512)) << name;
  const Tensor table = lists(rng, lengths, K, scatter, blank, blank_len);
  const int64_t T = table.dim(0);
  // DeepSeek-V3.2's scale (192^-0.5 times the YaRN mscale squared), not 576^-0.5.
  const ops::SparseMqaParams p{.tokens = T,
                               .heads = H,
                               .qk_dim = 576,
                               .v_dim = 512,
                               .kmax = K,
                               .scale = 0.135234f,
                               .kernels = gen};
  std::vector<In> ins = {{randn(rng, {T, H, 576}, 0.5)},
                         {randn(rng, {T, 576}, 0.5)},
                         {table, false},
                         {randn(rng, {T, H, 512})}};
  std::vector<std::string> names = {"o", "lse"};
  if (!forward_only)
    for (const char* n : {"prob_sum", "dq", "dkv", "bwd prob_sum", "dq (with it)", "dkv (with it)"})
      names.emplace_back(n);
  run_case(
      name.c_str(), ins, names,
      [&](Context& c, const std::vector<Tensor>& in, bool gpu) -> std::vector<Tensor> {
        const DType dt = in[0].dtype();
        Tensor o = out(c, {T, H, 512}, dt), lse = out(c, {T, H}, DType::F32);
        OP(sparse_mqa_forward)(c, p, in[0], in[1], in[2], o, lse);
        if (forward_only) return {o, lse};
        Tensor prob = out(c, {T, K}, DType::F32);
        OP(sparse_mqa_prob_sum)(c, p, in[0], in[1], in[2], lse, prob);
        Tensor dq = out(c, in[0].shape(), dt), dkv = out(c, in[1].shape(), dt), none;
        OP(sparse_mqa_backward)(c, p, in[0], in[1], in[2], o, lse, in[3], dq, dkv, none);
        // The backward's KL target (the DSA layer's training step): the prob-sum pass's values,
        // formed from the same S and lse in the same order, so equal to rounding on every pass.
        Tensor pb = out(c, {T, K}, DType::F32);
        Tensor dq2 = out(c, in[0].shape(), dt), dkv2 = out(c, in[1].shape(), dt);
        OP(sparse_mqa_backward)(c, p, in[0], in[1], in[2], o, lse, in[3], dq2, dkv2, pb);
        expect_same_target(prob, pb, name.c_str(), gpu, dt);
        return {o, lse, prob, dq, dkv, pb, dq2, dkv2};
      },
      // A key's gradient sums over every (query, head) that lists it.
      seed, T* H);
}

// The case on each generation of the kernels, fresh inputs for each.
void check_mqa(const char* name, int64_t H, int64_t K, const std::vector<int64_t>& lengths,
               bool scatter, uint64_t seed, Rng& rng, int64_t blank = -1, int64_t blank_len = 32) {
  for (const ops::SparseMqaKernels k :
       {ops::SparseMqaKernels::Split, ops::SparseMqaKernels::Chained, ops::SparseMqaKernels::Wgmma,
        ops::SparseMqaKernels::Wgmma2, ops::SparseMqaKernels::Wgmma3}) {
    const bool fwd_only = k == ops::SparseMqaKernels::Wgmma || k == ops::SparseMqaKernels::Wgmma2;
    if ((fwd_only || k == ops::SparseMqaKernels::Wgmma3) && H > 32) continue;  // Split's run there
    check_one(k, std::string(name) + " [" + ops::sparse_mqa_kernels_name(k) + " kernels]", H, K,
              lengths, scatter, blank, blank_len, seed, rng, fwd_only);
  }
}

TEST(CudaSparseMqa, Heads16_32_64) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_mqa("16 heads, two documents, scattered", 16, 64, {70, 61}, true, seed, rng);
  check_mqa("32 heads, selection lists, 3 tiles", 32, 96, {130, 70}, false, seed, rng);
  check_mqa("64 heads, lists off the tile", 64, 40, {150}, false, seed, rng);
}

// 24 heads: one block with 8 padded MMA rows; 80: a block of 64 and one of 16 padded to 64.
TEST(CudaSparseMqa, PaddedHeadBlocks) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_mqa("24 heads", 24, 50, {45, 1, 54}, true, seed, rng);
  check_mqa("80 heads", 80, 33, {77}, false, seed, rng);
}

TEST(CudaSparseMqa, LargerSelection) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_mqa("T=700 k=256", 32, 256, {500, 200}, false, seed, rng);
}

// The Split kernels' tile edges: one tile (no gather inside the loop), a second tile of one
// slot, and a tile whose slots are all unused between valid ones (its barriers without work, the
// next gather still issued), at 32 and 16 heads.
TEST(CudaSparseMqa, SplitTileEdges) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_mqa("32 heads, one tile of 20 slots", 32, 20, {40, 23}, false, seed, rng);
  check_mqa("32 heads, k=33", 32, 33, {90}, true, seed, rng);
  check_mqa("32 heads, second tile blank", 32, 96, {120}, false, seed, rng, 32);
  check_mqa("16 heads, first tile blank, scattered", 16, 70, {60, 50}, true, seed, rng, 0);
}

// The smallest inputs that still run every phase of the Split kernels at 32 heads (two key tiles,
// the second partial, two documents): sized for compute-sanitizer's racecheck and synccheck,
// which the tests above outlast (each access to shared memory is checked).
TEST(CudaSparseMqa, SanitizerSized) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_one(ops::SparseMqaKernels::Split, "32 heads, 40 slots, 2 documents [split kernels]", 32, 40,
            {30, 17}, true, -1, 32, seed, rng);
}

// The same for the Wgmma forward's two forms (their backward is Split's): two 64-key tiles, the
// second partial.
TEST(CudaSparseMqa, SanitizerSizedWgmma) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  for (const ops::SparseMqaKernels k :
       {ops::SparseMqaKernels::Wgmma, ops::SparseMqaKernels::Wgmma2}) {
    check_one(k,
              std::string("32 heads, 80 slots, 2 documents [") + ops::sparse_mqa_kernels_name(k) +
                  " kernels]",
              32, 80, {50, 40}, true, -1, 32, seed, rng);
  }
}

// The wgmma backward and prob sum (Wgmma3: two warpgroups exchanging P and dS through shared
// memory, one key buffer regathered under the key-gradient reds) at the same size, on its own so
// that racecheck / synccheck can take it alone.
TEST(CudaSparseMqa, SanitizerSizedWgmmaBackward) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_one(ops::SparseMqaKernels::Wgmma3, "32 heads, 80 slots, 2 documents [wgmma3 kernels]", 32,
            80, {50, 40}, true, -1, 32, seed, rng);
}

// The Wgmma forward's 64-key tiles: a whole tile without a valid slot between valid ones, lists
// of two slots (tiles of one or two valid keys), and a second tile of one slot with 8 heads (24
// padded rows of the MMA's N); every generation runs them.
TEST(CudaSparseMqa, WgmmaTileEdges) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  check_mqa("32 heads, 64-key tile 1 blank", 32, 192, {230}, false, seed, rng, 64, 64);
  check_mqa("32 heads, 64-key tile 0 blank", 32, 130, {150}, false, seed, rng, 0, 64);
  // Two slots, not one: with one slot P = 1, dS = P (dP - Delta) cancels to zero exactly and dq is
  // rounding noise against a zero reference (session 14 mid-call: rel err 1e26 on every kernel).
  check_mqa("32 heads, two slots", 32, 2, {50}, false, seed, rng);
  check_mqa("8 heads, k=65, scattered", 8, 65, {100}, true, seed, rng);
  // Three tiles, the last of one slot, two documents (rows whose lists end in the first or the
  // second tile), and the middle one blank: the wgmma backward's skipped tile writes its KL slots
  // as zeros and still gathers the next.
  check_mqa("32 heads, k=129, tile 1 blank, two documents", 32, 129, {150, 90}, false, seed, rng,
            64, 64);
}

}  // namespace
}  // namespace mt::test
