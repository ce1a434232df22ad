// The gated DSA layer's sparse stage at 131072 tokens on the GPU (issue 13: "outputs and
// gradients on a sample of rows compared with a reference computed for those rows alone"), at
// the benchmark layer's shapes: 32 heads, MLA nope 128 + rope 64, v 128, kv_lora_rank 512,
// indexer 8 x 64, top-2048, bf16, one document. The chain is the one DsaLayer runs on this path
// (select_keys, MlaLayer::absorbed_forward / absorbed_backward, the output gate): the fused
// indexer + top-k, W_UK folded into q, sparse MQA attention over the 576-wide shared entries, the
// head-summed probabilities (the KL's target), W_UV, the sigmoid gate; backward from a gradient of
// the gated output that is non-zero only on the sampled rows. So a sampled row's dq, dg and output
// depend on that row alone, and the key and kv_b_proj gradients are sums over the sampled rows:
// tests/ref/dsa_rows_ref.h computes all of them exactly in double, for those rows only (nothing
// T x T is formed anywhere).
//
// Inputs are fresh bf16 draws; element i of each tensor is the i-th normal of its own
// counter-based stream (core/rng.h), so the host redraws any element it needs without keeping
// the 1.6 GB q. Checks:
// - selection, per sampled row: rows with at most 2048 causal keys list all of them; the others
//   list 2048 distinct increasing positions <= t, and every difference from the reference top-k
//   (score descending, the lower position first on ties) lies within 1e-4 of the row's largest
//   |score| around the reference's 2048th score: the GPU sums the 64-term dot products in fp32
//   in another order, so keys whose scores are that close to the threshold may trade places
//   (near-ties, not errors: each swap is printed with its score gap), and at most 16 may;
// - attention outputs and gradients against the reference over the GPU's own lists, by the bf16
//   rule of tests/harness/tolerance.h: error below kBf16Multiple times the error of the same
//   reference rounded to bf16 where the GPU stores bf16, plus kBf16Floor; every key gradient row
//   outside the sampled rows' lists must be exactly zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <set>

#include "core/dtype.h"
#include "core/seq_info.h"
#include "harness/gpu_check.h"
#include "harness/op_check.h"
#include "harness/seed.h"
#include "harness/tolerance.h"
#include "model/mla_layer.h"
#include "ops/activation.h"
#include "ops/indexer.h"
#include "ops/sparse_mqa_attention.h"
#include "ref/dsa_rows_ref.h"

namespace mt::test {
namespace {

constexpr int64_t kH = 32, kNope = 128, kRope = 64, kDv = 128, kKvr = 512, kHI = 8, kDI = 64;
constexpr int64_t kDq = kNope + kRope, kDa = kKvr + kRope;

// Element i of a generated tensor: bf16(scale * z_i), z_i the i-th normal of stream `seed`
// (Rng::normal takes two counters).
float draw(uint64_t seed, int64_t i, double scale) {
  Rng r(seed, 2 * static_cast<uint64_t>(i));
  return bf16_to_f32(f32_to_bf16(static_cast<float>(scale * r.normal())));
}

ref::DVec draws(uint64_t seed, int64_t begin, int64_t n, double scale) {
  ref::DVec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = draw(seed, begin + i, scale);
  return v;
}

// A tensor on `device` holding draw(seed, i, scale) (bf16, or the same values in f32),
// generated on every core in chunks; `keep` receives the values when given.
Tensor generated(const Shape& shape, Device device, DType dt, uint64_t seed, double scale,
                 std::vector<float>* keep = nullptr) {
  Tensor d = Tensor::empty(shape, dt, device);
  const int64_t n = d.numel(), chunk = int64_t{1} << 24;
  Tensor flat = d.view({n});
  Tensor h = Tensor::empty({std::min(n, chunk)}, DType::BF16);
  if (keep) keep->resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t e = std::min(n, b + chunk);
    uint16_t* p = h.bf16();
#pragma omp parallel for schedule(static)
    for (int64_t i = b; i < e; ++i) {
      Rng r(seed, 2 * static_cast<uint64_t>(i));
      p[i - b] = f32_to_bf16(static_cast<float>(scale * r.normal()));
      if (keep) (*keep)[static_cast<size_t>(i)] = bf16_to_f32(p[i - b]);
    }
    Tensor part = flat.rows(b, e);
    part.copy_from(h.rows(0, e - b));
  }
  return d;
}

// Row t of a device tensor (f32 or bf16) as doubles.
ref::DVec row(const Tensor& d, int64_t t) {
  const Tensor r = d.rows(t, t + 1);
  Tensor h = Tensor::empty(r.shape());
  h.copy_from(r);
  return to_dvec(h);
}

void append(ref::DVec& to, const ref::DVec& v) {
  to.insert(to.end(), v.begin(), v.end());
}

// GPU results and the two references (exact, and rounded where the GPU stores bf16) of one
// output, over the sampled rows.
struct Compared {
  ref::DVec gpu, exact, emul;
};

// bf16: the harness's bf16 rule against the emulation; f32 (the CPU run): f32_bound(terms).
void expect_within(const char* name, const Compared& c, DType dt, int64_t terms) {
  ASSERT_EQ(c.gpu.size(), c.exact.size()) << name;
  size_t nonfinite = 0;
  for (double v : c.gpu) nonfinite += !std::isfinite(v);
  EXPECT_EQ(nonfinite, 0u) << name << " has non-finite entries";
  const double err = rel_err(c.gpu, c.exact);
  const double bound =
      dt == DType::BF16 ? kBf16Multiple * rel_err(c.emul, c.exact) + kBf16Floor : f32_bound(terms);
  EXPECT_LE(err, bound) << name;
  std::printf("  %-10s rel err %.3g (bound %.3g; bf16 emulation %.3g; %zu values)\n", name, err,
              bound, rel_err(c.emul, c.exact), c.gpu.size());
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The chain on `device` in `dt` over one document of T tokens with top-`kTopk` selection.
void check_sampled_rows(Device device, DType dt, int64_t T, int64_t topk) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("T=", T, " seed=", seed, " (rerun: ", seed_note(), ")"));
  const auto t_start = std::chrono::steady_clock::now();
  Rng rng(seed);
  const uint64_t s_qi = rng.next_u64(), s_ki = rng.next_u64(), s_wi = rng.next_u64(),
                 s_q = rng.next_u64(), s_w = rng.next_u64(), s_kv = rng.next_u64(),
                 s_g = rng.next_u64(), s_dog = rng.next_u64();
  ASSERT_GT(T / 4, topk + 1);
  // Rows with fewer causal keys than top-k, exactly top-k, one more, three in between, the end.
  const std::vector<int64_t> rows = {rng.below(topk - 1),
                                     topk - 1,
                                     topk,
                                     topk + 1 + rng.below(T / 4 - topk - 1),
                                     T / 4 + rng.below(T / 4),
                                     T / 2 + rng.below(T / 2 - 2),
                                     T - 2,
                                     T - 1};
  std::printf("  seed %llu, rows", static_cast<unsigned long long>(seed));
  for (int64_t t : rows) std::printf(" %lld", static_cast<long long>(t));
  std::printf("\n");

  Context ctx(ContextOptions{.device = device, .seed = seed, .workspace_bytes = size_t{2} << 30});
  SeqInfo seq = SeqInfo::uniform(1, T);
  seq.cu_seqlens = seq.cu_seqlens.to(device);
  seq.positions = seq.positions.to(device);
  // Scales: unit-variance keys and latents (the layer normalises both), head weights of
  // std HI^-0.5 (the layer's scaling), W_UK / W_UV of std 0.05, which gives attention logits of
  // about unit spread: neither uniform nor one-hot.
  std::vector<float> ki_host, w_host;
  const auto gen = [&](const Shape& s, uint64_t sd, double scale,
                       std::vector<float>* keep = nullptr) {
    return generated(s, device, dt, sd, scale, keep);
  };
  Tensor qi = gen({T, kHI, kDI}, s_qi, 1.0), ki = gen({T, kDI}, s_ki, 1.0, &ki_host),
         wi = gen({T, kHI}, s_wi, 1 / std::sqrt(static_cast<double>(kHI)));
  Tensor q = gen({T, kH, kDq}, s_q, 1.0), w = gen({kH * (kNope + kDv), kKvr}, s_w, 0.05, &w_host),
         kvl = gen({T, kDa}, s_kv, 1.0), g = gen({T, kH * kDv}, s_g, 1.0);
  Tensor dog = Tensor::zeros({T, kH * kDv}, dt, device);
  for (int64_t t : rows) {
    Tensor h = Tensor::empty({1, kH * kDv});
    const ref::DVec v = draws(s_dog, t * kH * kDv, kH * kDv, 1.0);
    for (int64_t i = 0; i < kH * kDv; ++i) h.f32()[i] = static_cast<float>(v[i]);
    Tensor part = dog.rows(t, t + 1);
    part.copy_from(h);
  }
  std::printf("  inputs generated in %.1f s\n", seconds_since(t_start));

  // Forward and backward, as DsaLayer runs them on this path.
  const auto t_gpu = std::chrono::steady_clock::now();
  const MlaAbsorbDims ad{.heads = kH, .nope = kNope, .rope = kRope, .v_dim = kDv, .kv_rank = kKvr};
  const float scale = 1.f / std::sqrt(static_cast<float>(kDq));
  const ops::SparseMqaParams mp{
      .tokens = T, .heads = kH, .qk_dim = kDa, .v_dim = kKvr, .kmax = topk, .scale = scale};
  const DType bf = dt;
  Tensor idx = Tensor::empty({T, topk}, DType::I32, device);
  ops::indexer_causal_topk(ctx, {.tokens = T, .heads = kHI, .head_dim = kDI}, seq, qi, ki, wi, topk,
                           idx);
  Tensor qa = Tensor::empty({T, kH, kDa}, bf, device),
         ol = Tensor::empty({T, kH, kKvr}, bf, device),
         lse = Tensor::empty({T, kH}, DType::F32, device),
         o = Tensor::empty({T, kH, kDv}, bf, device), og = Tensor::empty({T, kH * kDv}, bf, device),
         prob = Tensor::empty({T, topk}, DType::F32, device),
         prob_bwd = Tensor::empty({T, topk}, DType::F32, device);
  const Tensor o2 = o.view({T, kH * kDv});
  mla_absorb_q(ctx, ad, w, q, qa);
  ops::sparse_mqa_forward(ctx, mp, qa, kvl, idx, ol, lse);
  ops::sparse_mqa_prob_sum(ctx, mp, qa, kvl, idx, lse, prob);
  mla_expand_o(ctx, ad, w, ol, o);
  ops::sigmoid_gate_forward(ctx, o2, g, og);
  Tensor dout = Tensor::empty({T, kH, kDv}, bf, device),
         dg = Tensor::empty({T, kH * kDv}, bf, device),
         dol = Tensor::empty({T, kH, kKvr}, bf, device),
         dqa = Tensor::empty({T, kH, kDa}, bf, device), dkvl = Tensor::empty({T, kDa}, bf, device),
         dq = Tensor::empty({T, kH, kDq}, bf, device),
         dw = Tensor::zeros(w.shape(), DType::F32, device);
  Tensor dout2 = dout.view({T, kH * kDv});
  ops::sigmoid_gate_backward(ctx, o2, g, dog, dout2, dg);
  mla_expand_o_backward(ctx, ad, w, ol, dout, dol, dw);
  // With the KL target, as the layer's training step forms it (DsaLayer::backward).
  ops::sparse_mqa_backward(ctx, mp, qa, kvl, idx, ol, lse, dol, dqa, dkvl, prob_bwd);
  mla_absorb_q_backward(ctx, ad, w, q, dqa, dq, dw);
  ctx.synchronize();
  std::printf("  forward + backward (first calls included) in %.1f s\n", seconds_since(t_gpu));

  // Selection.
  const auto t_ref = std::chrono::steady_clock::now();
  const double iscale = 1 / std::sqrt(static_cast<double>(kDI));
  std::vector<std::vector<int64_t>> lists;
  for (int64_t t : rows) {
    SCOPED_TRACE(cat("row ", t));
    Tensor h = Tensor::empty({1, topk}, DType::I32);
    h.copy_from(idx.rows(t, t + 1));
    std::vector<int64_t> got;
    bool tail = false, ordered = true;
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t s = h.i32()[j];
      if (s < 0) {
        tail = true;
        continue;
      }
      ordered &= !tail && s <= t && (got.empty() || s > got.back());
      got.push_back(s);
    }
    EXPECT_TRUE(ordered) << "the list is not increasing, causal and -1 padded";
    lists.push_back(got);
    if (t + 1 <= topk) {
      std::vector<int64_t> all(static_cast<size_t>(t + 1));
      for (int64_t s = 0; s <= t; ++s) all[static_cast<size_t>(s)] = s;
      EXPECT_EQ(got, all) << "a row with at most top-k causal keys lists every one";
      continue;
    }
    const ref::DVec qrow = draws(s_qi, t * kHI * kDI, kHI * kDI, 1.0);
    const ref::DVec wrow = draws(s_wi, t * kHI, kHI, 1 / std::sqrt(static_cast<double>(kHI)));
    const ref::DVec scores =
        ref::indexer_row_scores(qrow, wrow, ki_host.data(), t, kHI, kDI, iscale);
    const std::vector<int64_t> want = ref::topk_positions(scores, topk);
    ASSERT_EQ(got.size(), want.size());
    ref::DVec sorted = scores;
    std::nth_element(sorted.begin(), sorted.begin() + (topk - 1), sorted.end(),
                     std::greater<double>());
    const double threshold = sorted[topk - 1];
    double top = 0;
    for (double v : scores) top = std::max(top, std::abs(v));
    const double slack = 1e-4 * top;
    std::vector<int64_t> extra, missing;
    std::set_difference(got.begin(), got.end(), want.begin(), want.end(),
                        std::back_inserter(extra));
    std::set_difference(want.begin(), want.end(), got.begin(), got.end(),
                        std::back_inserter(missing));
    EXPECT_LE(extra.size(), 16u) << "more swaps than near-ties explain";
    for (int64_t s : extra)
      EXPECT_GE(scores[static_cast<size_t>(s)], threshold - slack)
          << "GPU selected " << s << ", score " << scores[static_cast<size_t>(s)]
          << " below the threshold " << threshold;
    for (int64_t s : missing)
      EXPECT_LE(scores[static_cast<size_t>(s)], threshold + slack)
          << "GPU left out " << s << ", score " << scores[static_cast<size_t>(s)]
          << " above the threshold " << threshold;
    std::printf(
        "  row %6lld: top-k of %lld keys, %zu near-tie swaps (threshold %.6g, slack %.3g)\n",
        static_cast<long long>(t), static_cast<long long>(t + 1), extra.size(), threshold, slack);
  }

  // Attention, per row, over the GPU's lists (checked above), exact and bf16-emulated.
  const ref::DsaRowDims dims{.heads = kH,
                             .nope = kNope,
                             .rope = kRope,
                             .v_dim = kDv,
                             .kv_rank = kKvr,
                             .scale = static_cast<double>(scale)};
  const ref::DVec wd(w_host.begin(), w_host.end());
  const size_t R = rows.size();
  std::vector<ref::DsaRowIn> ins(R);
  for (size_t r = 0; r < R; ++r) {
    const int64_t t = rows[r];
    ref::DsaRowIn& in = ins[r];
    in.q = draws(s_q, t * kH * kDq, kH * kDq, 1.0);
    in.g = draws(s_g, t * kH * kDv, kH * kDv, 1.0);
    in.dog = draws(s_dog, t * kH * kDv, kH * kDv, 1.0);
    in.keys = static_cast<int64_t>(lists[r].size());
    for (int64_t s : lists[r]) append(in.kv, draws(s_kv, s * kDa, kDa, 1.0));
  }
  std::vector<ref::DsaRowOut> exact(R), emul(R);
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < static_cast<int64_t>(2 * R); ++i) {
    const size_t r = static_cast<size_t>(i) / 2;
    (i % 2 ? emul : exact)[r] = ref::dsa_row(dims, wd, ins[r], i % 2 == 1);
  }

  Compared c_o, c_og, c_lse, c_prob, c_prob_bwd, c_dg, c_dq;
  for (size_t r = 0; r < R; ++r) {
    const int64_t t = rows[r];
    auto add = [&](Compared& c, const ref::DVec& gpu, const ref::DVec& ex, const ref::DVec& em) {
      append(c.gpu, gpu);
      append(c.exact, ex);
      append(c.emul, em);
    };
    add(c_o, row(o2, t), exact[r].o, emul[r].o);
    add(c_og, row(og, t), exact[r].og, emul[r].og);
    add(c_lse, row(lse, t), exact[r].lse, emul[r].lse);
    for (auto [table, c] : {std::pair{&prob, &c_prob}, std::pair{&prob_bwd, &c_prob_bwd}}) {
      ref::DVec p = row(*table, t);
      for (size_t j = lists[r].size(); j < p.size(); ++j)
        EXPECT_EQ(p[j], 0.0) << "row " << t << ": unused slot " << j << " has probability";
      p.resize(lists[r].size());
      add(*c, p, exact[r].prob, emul[r].prob);
    }
    add(c_dg, row(dg, t), exact[r].dg, emul[r].dg);
    add(c_dq, row(dq.view({T, kH * kDq}), t), exact[r].dq, emul[r].dq);
  }
  // The key gradient: the rows' shares summed per listed key; every other row zero.
  std::map<int64_t, std::pair<ref::DVec, ref::DVec>> dkv_ref;
  for (size_t r = 0; r < R; ++r)
    for (size_t j = 0; j < lists[r].size(); ++j) {
      auto& [ex, em] = dkv_ref[lists[r][j]];
      ex.resize(static_cast<size_t>(kDa), 0.0);
      em.resize(static_cast<size_t>(kDa), 0.0);
      for (int64_t c = 0; c < kDa; ++c) {
        ex[static_cast<size_t>(c)] += exact[r].dkv[j * kDa + c];
        em[static_cast<size_t>(c)] += emul[r].dkv[j * kDa + c];
      }
    }
  Tensor dkv_host = Tensor::empty({T, kDa});
  dkv_host.copy_from(dkvl);
  Compared c_dkv;
  int64_t stray = 0;
  for (int64_t s = 0; s < T; ++s) {
    const float* gpu = dkv_host.f32() + s * kDa;
    const auto it = dkv_ref.find(s);
    if (it == dkv_ref.end()) {
      for (int64_t c = 0; c < kDa; ++c) stray += gpu[c] != 0.f;
      continue;
    }
    for (int64_t c = 0; c < kDa; ++c) c_dkv.gpu.push_back(gpu[c]);
    append(c_dkv.exact, it->second.first);
    // Emulation: the sum rounds to bf16 once, at the end (the kernel's fp32 accumulator).
    for (double v : it->second.second) c_dkv.emul.push_back(ref::stored(v, true));
  }
  EXPECT_EQ(stray, 0) << "key gradient entries outside the sampled rows' lists";
  Compared c_dw;
  c_dw.exact.assign(wd.size(), 0.0);
  c_dw.emul.assign(wd.size(), 0.0);
  for (size_t r = 0; r < R; ++r) {
    ref::dsa_row_weight_grad(dims, ins[r], exact[r], c_dw.exact);
    ref::dsa_row_weight_grad(dims, ins[r], emul[r], c_dw.emul);
  }
  c_dw.gpu = to_dvec(dw.to(Device::CPU));
  std::printf("  references in %.1f s (%zu keys listed)\n", seconds_since(t_ref), dkv_ref.size());
  // The longest sum: a key's gradient over every (row, head) listing it, each of Da terms.
  const int64_t terms = static_cast<int64_t>(R) * kH * kDa;

  expect_within("o", c_o, dt, terms);
  expect_within("gated o", c_og, dt, terms);
  expect_within("lse", c_lse, dt, terms);
  expect_within("prob_sum", c_prob, dt, terms);
  expect_within("prob_sum (backward's)", c_prob_bwd, dt, terms);
  expect_within("dg", c_dg, dt, terms);
  expect_within("dq", c_dq, dt, terms);
  expect_within("dkv", c_dkv, dt, terms);
  expect_within("dW kv_b", c_dw, dt, terms);
  std::printf("  total %.1f s\n", seconds_since(t_start));
}

TEST(CudaDsaLong, SampledRowsAt131072) {
  REQUIRE_GPU();
  ASSERT_TRUE(ops::indexer_topk_fits(kHI, kDI));
  ASSERT_TRUE(ops::sparse_mqa_fits(kH, kKvr + kRope, kKvr));
  check_sampled_rows(Device::CUDA, DType::BF16, 131072, 2048);
}

// The same chain through the CPU ops (fp32, the composite selection) at a short length: the
// row reference and the sampling logic above against the engine's checked CPU path.
TEST(CudaDsaLong, CpuChainAtShortLengthMatchesTheRowReference) {
  check_sampled_rows(Device::CPU, DType::F32, 700, 96);
}

}  // namespace
}  // namespace mt::test
