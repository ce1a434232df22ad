// bench moe: the routed experts' grouped SwiGLU FFN (frozen, full, LoRA; eager and from a CUDA
// graph) and the MoE layer's routing around it at issue 14's shapes, beside bench/moe_torch.py's
// torch._grouped_mm.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "cli/bench_kernels.h"
#include "cli/bench_util.h"
#include "core/device.h"
#include "core/seq_info.h"
#include "ops/elementwise.h"
#include "ops/expert_load.h"
#include "ops/gemm.h"
#include "ops/grouped_ffn.h"
#include "ops/grouped_matmul.h"
#include "ops/moe_dispatch.h"
#include "ops/router.h"

namespace mt::cli {

namespace {

ops::LoraKernels parse_lora_kernels(const std::string& s) {
  if (s == "separate") return ops::LoraKernels::Separate;
  if (s == "staged") return ops::LoraKernels::Staged;
  if (s == "gemm") return ops::LoraKernels::Gemm;
  MT_CHECK(
      s == "registers", ValueError,
      "bench moe: LoRA kernels are separate, staged, registers or gemm (xa and dr only), got \"", s,
      "\"");
  return ops::LoraKernels::Registers;
}

const char* lora_kernels_name(ops::LoraKernels k) {
  return k == ops::LoraKernels::Separate    ? "separate"
         : k == ops::LoraKernels::Staged    ? "staged"
         : k == ops::LoraKernels::Registers ? "registers"
                                            : "gemm";
}

// Whether `cases` (MoeBenchOptions::cases) selects shape `name` with this routing.
bool moe_case_selected(const std::string& cases, const std::string& name, bool skewed) {
  if (cases.empty()) return true;
  std::stringstream ss(cases);
  for (std::string c; std::getline(ss, c, ',');) {
    const std::string routing = skewed ? "skewed" : "uniform";
    if (c == name || c == name + ":" + routing) return true;
  }
  return false;
}

// Rows per expert summing to `rows`: equal, or every eighth expert `hot` times the others.
std::vector<int32_t> expert_offsets(int64_t rows, int64_t experts, bool skewed) {
  const int64_t hot = 30;
  const auto weight = [&](size_t e) { return skewed && e % 8 == 0 ? hot : int64_t{1}; };
  const size_t n = static_cast<size_t>(experts);
  int64_t total = 0;
  for (size_t e = 0; e < n; ++e) total += weight(e);
  std::vector<int32_t> off(n + 1, 0);
  int64_t given = 0;
  for (size_t e = 0; e < n; ++e) {
    const int64_t share = rows * weight(e) / total;
    off[e + 1] = static_cast<int32_t>(off[e] + share);
    given += share;
  }
  // The remainder, one row each to the first experts.
  for (size_t e = 0; given < rows; ++e, ++given)
    for (size_t f = e + 1; f <= n; ++f) ++off[f];
  return off;
}

// The MoE layer's routing around the grouped experts, timed per part on the same ops in the same
// order as MoeLayer::forward / backward (model/moe_layer.cpp; no latent projection, as at the
// bench shapes, and no shared experts): forward the router GEMM (bf16 tokens x gate -> f32
// logits), the router (sigmoid scores, top-k on score + correction bias, renormalised weights
// times Kimi-Linear's routed scaling 2.446, one group as Kimi's configs have it) with the aux
// statistics the layer always computes (seq aux loss, z-loss), the dispatch plan (CUB's sort,
// offsets, the expert load count and the offsets' copy to the host: the layer's one wait), the
// gather of token rows into expert order and the weighted combine; backward the combine's
// (row gradients and weight gradients), the gather's, the router's (with the seq aux loss's
// gradient at the seed config's coefficient; the z-loss's is off there) and the router GEMM's
// two (dlogits narrowed to bf16, then the gate's gradient and dX). The routing is the router's
// own choice on random tokens (N(0, 1), gate N(0, 1/d): near-uniform), one document; the
// grouped FFN beside it runs the case's synthetic offsets.
nlohmann::json bench_routing(Context& ctx, int64_t T, int64_t K, int64_t E, int64_t d,
                             const std::function<double(const std::function<void()>&)>& time) {
  Rng rng(2);
  const DType bf = DType::BF16, f32 = DType::F32, i32 = DType::I32;
  const Device D = Device::CUDA;
  const int64_t N = T * K;
  const float seq_aux_coeff = 1e-4f;  // configs/seed-2.8t.json's router_aux_loss_coef
  const ops::RouterParams rp{.tokens = T,
                             .experts = E,
                             .top_k = K,
                             .score = ops::ScoreFunc::Sigmoid,
                             .n_group = 1,
                             .topk_group = 1,
                             .norm_topk_prob = true,
                             .routed_scaling = 2.446f};
  const SeqInfo seq = SeqInfo::uniform(1, T);  // the aux statistics read its host offsets
  const Tensor x = random_device({T, d}, bf, rng),
               gate = random_device({E, d}, bf, rng, 1 / std::sqrt(static_cast<double>(d))),
               bias = random_device({E}, f32, rng, 0.01);
  Tensor logits = Tensor::empty({T, E}, f32, D), scores = Tensor::empty({T, E}, f32, D),
         ids = Tensor::empty({T, K}, i32, D), weights = Tensor::empty({T, K}, f32, D),
         aux = Tensor::empty({1}, DType::F64, D), zloss = Tensor::empty({1}, DType::F64, D);
  Tensor perm = Tensor::empty({N}, i32, D), inv = Tensor::empty({N}, i32, D),
         offsets = Tensor::empty({E + 1}, i32, D), offsets_host = Tensor::empty({E + 1}, i32),
         load = Tensor::zeros({E}, DType::I64, D);
  // Expert outputs and row gradients: random stand-ins for what the grouped FFN would write.
  const Tensor rows_out = random_device({N, d}, bf, rng), drows = random_device({N, d}, bf, rng),
               dy = random_device({T, d}, bf, rng);
  Tensor rows = Tensor::empty({N, d}, bf, D), y = Tensor::empty({T, d}, bf, D),
         drows_out = Tensor::empty({N, d}, bf, D), dweights = Tensor::empty({T, K}, f32, D),
         dx = Tensor::empty({T, d}, bf, D), dlogits = Tensor::empty({T, E}, f32, D),
         dl = Tensor::empty({T, E}, bf, D), dgate = Tensor::zeros({E, d}, f32, D);
  nlohmann::json r;
  // In the layer's order, so each part reads what the one before wrote (warm-up included).
  const double gemm_f = time([&] { ops::matmul(ctx, x, false, gate, true, logits); });
  const double router_f = time([&] {
    ops::router_forward(ctx, rp, logits, bias, scores, ids, weights);
    ops::router_seq_aux_loss(ctx, rp, seq, scores, ids, aux);
    ops::router_z_loss(ctx, rp, logits, zloss);
  });
  const double plan = time([&] {
    ops::moe_dispatch_plan(ctx, ids, E, perm, inv, offsets);
    ops::expert_load_count(ctx, offsets, Tensor(), load);
    offsets_host.copy_from(offsets);
  });
  const double gather = time([&] { ops::moe_gather(ctx, x, perm, K, rows); });
  const double combine_f = time([&] { ops::moe_combine(ctx, rows_out, weights, inv, y); });
  const double combine_b = time(
      [&] { ops::moe_combine_backward(ctx, rows_out, weights, inv, dy, drows_out, dweights); });
  const double gather_b = time([&] { ops::moe_gather_backward(ctx, drows, inv, K, dx); });
  const double router_b = time([&] {
    ops::router_backward(ctx, rp, scores, ids, dweights, dlogits);
    ops::router_seq_aux_backward(ctx, rp, seq, scores, ids, seq_aux_coeff, dlogits);
  });
  const double gemm_b = time([&] {
    ops::copy(ctx, dlogits, dl);
    ops::matmul(ctx, dl, true, x, false, dgate, 1.f, 1.f);
    ops::matmul(ctx, dl, false, gate, false, dx, 1.f, 1.f);
  });
  int32_t most = 0;
  for (int64_t e = 0; e < E; ++e)
    most = std::max(most, offsets_host.i32()[e + 1] - offsets_host.i32()[e]);
  r["routing_max_rows_per_expert"] = most;
  r["router_gemm_fwd_ms"] = gemm_f;
  r["router_fwd_ms"] = router_f;
  r["dispatch_plan_ms"] = plan;
  r["gather_ms"] = gather;
  r["combine_fwd_ms"] = combine_f;
  r["routing_total_fwd_ms"] = gemm_f + router_f + plan + gather + combine_f;
  r["combine_bwd_ms"] = combine_b;
  r["gather_bwd_ms"] = gather_b;
  r["router_bwd_ms"] = router_b;
  r["router_gemm_bwd_ms"] = gemm_b;
  r["routing_total_bwd_ms"] = combine_b + gather_b + router_b + gemm_b;
  return r;
}

// A CUDA graph of `f` (core/graph.h) replayed `iters` times: its mean time under `key` and the
// launches one call makes under `launches_key` (the graph's kernel nodes; memsets under
// `launches_key` + "_memsets"), or, where capture fails, the reason under `key` + "_error".
void time_graph(Context& ctx, const MoeBenchOptions& o, const std::function<void()>& f,
                const std::string& key, const std::string& launches_key, nlohmann::json& out) {
  OpGraph g;
  if (!capture_or_report(ctx, f, g, key + "_error", out)) return;
  out[key] = mean_ms(ctx, o.warmup, o.iters, [&] { g.replay(ctx); });
  out[launches_key] = g.nodes().kernels;
  out[launches_key + "_memsets"] = g.nodes().memsets;
}

// Alternating frozen / LoRA rounds behind lora_overhead_fwdbwd_median.
constexpr int kMoeRounds = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

nlohmann::json bench_moe_at(const MoeBenchOptions& o, const ops::GroupedGemmConfig& gemm,
                            const std::string& name, int64_t tokens, int64_t topk, int64_t E,
                            int64_t d, int64_t F, bool skewed) {
  Context ctx(gpu_options(o.workspace_gib));
  Rng rng(1);
  const DType bf = DType::BF16, f32 = DType::F32;
  const Device D = Device::CUDA;
  const int64_t rows = tokens * topk, r = o.lora_rank;
  const std::vector<int32_t> off = expert_offsets(rows, E, skewed);
  Tensor offsets = Tensor::empty({E + 1}, DType::I32);
  std::copy(off.begin(), off.end(), offsets.i32());  // host: the grouped ops read them there
  const double sd = 1 / std::sqrt(static_cast<double>(d)),
               sf = 1 / std::sqrt(static_cast<double>(F));
  Tensor x = random_device({rows, d}, bf, rng), dy = random_device({rows, d}, bf, rng);
  Tensor y = Tensor::empty({rows, d}, bf, D), dx = Tensor::empty({rows, d}, bf, D);
  ops::GroupedFfnWeights w{.gate_up = random_device({E, 2 * F, d}, bf, rng, sd),
                           .down = random_device({E, d, F}, bf, rng, sf)};
  ops::GroupedFfnWeights lw = w;
  lw.gate_up_a = random_device({E, r, d}, bf, rng, sd);
  lw.gate_up_b = random_device({E, 2 * F, r}, bf, rng, 0.01);
  lw.down_a = random_device({E, r, F}, bf, rng, sf);
  lw.down_b = random_device({E, d, r}, bf, rng, 0.01);
  const ops::GroupedFfnParams p{.rows = rows, .experts = E, .in = d, .ffn = F, .gemm = gemm};
  ops::GroupedFfnParams lp = p;
  lp.lora_rank = r;
  lp.lora_alpha = static_cast<float>(2 * r);
  ArenaPlan plan(bf, D), lplan(bf, D);
  ops::grouped_ffn_plan(p, plan);
  ops::grouped_ffn_plan(lp, lplan);
  Arena arena(plan.bytes(), D, "bench moe saved"), larena(lplan.bytes(), D, "bench moe saved");
  ops::GroupedFfnSaved saved = ops::grouped_ffn_alloc_saved(p, arena, bf);
  ops::GroupedFfnSaved lsaved = ops::grouped_ffn_alloc_saved(lp, larena, bf);
  // Expert LoRA K-concatenated where it applies (ops/grouped_ffn.h), as the MoE layer runs it:
  // the base weights in their padded buffers (copies here, so that the frozen runs and the
  // separate passes timed beside it keep theirs) and rows with r spare columns.
  const bool kconcat = ops::grouped_ffn_kconcat(lp, D, bf);
  ops::GroupedFfnWeights kw = lw;
  ops::GroupedFfnParams kp = lp;
  if (!o.lora_fwd.empty()) kp.lora_fwd = parse_lora_kernels(o.lora_fwd);
  if (!o.lora_bwd.empty()) kp.lora_bwd = parse_lora_kernels(o.lora_bwd);
  if (!o.lora_og.empty()) kp.lora_out_grads = parse_lora_kernels(o.lora_og);
  if (!o.lora_xa.empty()) kp.lora_xa = parse_lora_kernels(o.lora_xa);
  if (!o.lora_dr.empty()) kp.lora_dr = parse_lora_kernels(o.lora_dr);
  Tensor kx = x, kdy = dy;
  if (kconcat) {
    kw.gate_up = ops::grouped_ffn_pad_weight(w.gate_up, r);
    kw.down = ops::grouped_ffn_pad_weight(w.down, r);
    kp.padded_rows = true;
    kx = Tensor::empty({rows, ops::grouped_ffn_rows_pitch(kp)}, bf, D).cols(0, d);
    kx.copy_from(x);
    kdy = Tensor::empty({rows, ops::grouped_ffn_rows_pitch(kp)}, bf, D).cols(0, d);
    kdy.copy_from(dy);
  }
  // Gradients are fp32 (as the parameter store keeps them); frozen members stay undefined.
  ops::GroupedFfnWeights frozen, full{.gate_up = Tensor::zeros({E, 2 * F, d}, f32, D),
                                      .down = Tensor::zeros({E, d, F}, f32, D)};
  ops::GroupedFfnWeights lora{.gate_up_a = Tensor::zeros({E, r, d}, f32, D),
                              .gate_up_b = Tensor::zeros({E, 2 * F, r}, f32, D),
                              .down_a = Tensor::zeros({E, r, F}, f32, D),
                              .down_b = Tensor::zeros({E, d, r}, f32, D)};
  auto time = [&](const std::function<void()>& f) { return mean_ms(ctx, o.warmup, o.iters, f); };
  auto fwd = [&] { ops::grouped_ffn_forward(ctx, p, x, offsets, w, y, saved); };
  auto lfwd = [&] { ops::grouped_ffn_forward(ctx, kp, kx, offsets, kw, y, lsaved); };
  auto lbwd = [&] { ops::grouped_ffn_backward(ctx, kp, kx, offsets, kw, lsaved, kdy, dx, lora); };
  auto sfwd = [&] { ops::grouped_ffn_forward(ctx, lp, x, offsets, lw, y, lsaved); };
  auto bwd = [&](ops::GroupedFfnWeights& g) {
    ops::grouped_ffn_backward(ctx, p, x, offsets, w, saved, dy, dx, g);
  };
  // FLOPs as ../shared/bench/anchors_torch.py counts them: the up (2F) and down (F) projections
  // forward, twice that again for dX and for dW.
  const double flops =
      2.0 * static_cast<double>(rows) * static_cast<double>(d) * 3.0 * static_cast<double>(F);
  const double f = time(fwd);
  const auto frozen_fb = [&] {
    fwd();
    bwd(frozen);
  };
  double fb_frozen_host = 0, fb_written_host = 0;
  const double fb_frozen = mean_ms(ctx, o.warmup, o.iters, frozen_fb, &fb_frozen_host);
  const double fb_full = time([&] {
    fwd();
    bwd(full);
  });
  // The same where the gradients are known to hold zeros (a step's first backward since
  // zero_grad, as the MoE layer runs it): dW written, its f32 buffers never read.
  ops::GroupedFfnParams pz = p;
  pz.weight_grads_zero = true;
  const double fb_full_written = mean_ms(
      ctx, o.warmup, o.iters,
      [&] {
        fwd();
        ops::grouped_ffn_backward(ctx, pz, x, offsets, w, saved, dy, dx, full);
      },
      &fb_written_host);
  // The same with h kept from forward (GroupedFfnParams::keep_h): SwiGLU's backward writes no h.
  ops::GroupedFfnParams ph = pz;
  ph.keep_h = true;
  ArenaPlan hplan(bf, D);
  ops::grouped_ffn_plan(ph, hplan);
  Arena harena(hplan.bytes(), D, "bench moe saved");
  ops::GroupedFfnSaved hsaved = ops::grouped_ffn_alloc_saved(ph, harena, bf);
  const auto full_keep_h = [&] {
    ops::grouped_ffn_forward(ctx, ph, x, offsets, w, y, hsaved);
    ops::grouped_ffn_backward(ctx, ph, x, offsets, w, hsaved, dy, dx, full);
  };
  const double fb_full_keep_h = time(full_keep_h);
  const auto tf = [&](double mult, double ms) { return mult * flops / ms / 1e9; };
  int32_t most = 0;
  for (size_t e = 0; e + 1 < off.size(); ++e) most = std::max(most, off[e + 1] - off[e]);
  nlohmann::json run = {{"case", name},
                        {"grouped_gemm", ops::grouped_gemm_config_name(gemm)},
                        {"routing", skewed ? "skewed" : "uniform"},
                        {"tokens", tokens},
                        {"topk", topk},
                        {"experts", E},
                        {"d", d},
                        {"ffn", F},
                        {"max_rows_per_expert", most},
                        {"fwd_ms", f},
                        {"fwd_tflops", tf(1, f)},
                        {"fwdbwd_frozen_ms", fb_frozen},
                        {"fwdbwd_frozen_host_ms", fb_frozen_host},
                        {"fwdbwd_full_written_host_ms", fb_written_host},
                        {"fwdbwd_frozen_tflops", tf(2, fb_frozen)},
                        {"fwdbwd_full_ms", fb_full},
                        {"fwdbwd_full_tflops", tf(3, fb_full)},
                        {"fwdbwd_full_written_ms", fb_full_written},
                        {"fwdbwd_full_written_tflops", tf(3, fb_full_written)},
                        {"fwdbwd_full_written_keep_h_ms", fb_full_keep_h},
                        {"fwdbwd_full_written_keep_h_tflops", tf(3, fb_full_keep_h)}};
  // The interleaved gate/up layout (GroupedFfnParams::interleaved_gate_up; the same weights
  // permuted once): SwiGLU in the gate/up GEMM's epilogue. Forward, frozen and full (dW written, h
  // kept as that forward writes it anyway) forward+backward, each in alternating rounds with the
  // default layout's run (the median of the rounds' ratios: the clocks drift within a call).
  const bool interleave = o.interleaved && F % ops::kGateUpInterleave == 0;
  ops::GroupedFfnWeights iw = w;  // w's gate_up interleaved
  ops::GroupedFfnParams ip = p;
  ip.interleaved_gate_up = true;
  if (interleave) {
    iw.gate_up = Tensor::empty(w.gate_up.shape(), bf, D);
    ops::grouped_ffn_interleave_gate_up(ctx, w.gate_up, iw.gate_up);
  }
  const auto ifrozen = [&] {
    ops::grouped_ffn_forward(ctx, ip, x, offsets, iw, y, saved);
    ops::grouped_ffn_backward(ctx, ip, x, offsets, iw, saved, dy, dx, frozen);
  };
  if (interleave) {
    ops::GroupedFfnParams iph = ph;
    iph.interleaved_gate_up = true;
    const auto ifwd = [&] { ops::grouped_ffn_forward(ctx, ip, x, offsets, iw, y, saved); };
    const auto ifull = [&] {
      ops::grouped_ffn_forward(ctx, iph, x, offsets, iw, y, hsaved);
      ops::grouped_ffn_backward(ctx, iph, x, offsets, iw, hsaved, dy, dx, full);
    };
    const auto versus = [&](const char* key, const std::function<void()>& base,
                            const std::function<void()>& inter) {
      std::vector<double> ratios, inter_ms;
      for (int round = 0; round < kMoeRounds; ++round) {
        const double b = time(base);
        inter_ms.push_back(time(inter));
        ratios.push_back(inter_ms.back() / b);
      }
      run[std::string(key) + "_interleaved_ms"] = median(inter_ms);
      run[std::string(key) + "_interleaved_vs_default_median"] = median(ratios);
    };
    versus("fwd", fwd, ifwd);
    versus("fwdbwd_frozen", frozen_fb, ifrozen);
    versus("fwdbwd_full_written_keep_h", full_keep_h, ifull);
  }
  if (o.base_only) return run;
  const double lf = time(lfwd);
  double lfb_host = 0;
  const auto lora_fb = [&] {
    lfwd();
    lbwd();
  };
  const double lfb = mean_ms(ctx, o.warmup, o.iters, lora_fb, &lfb_host);
  run["lora_rank"] = r;
  run["lora_fwd_ms"] = lf;
  run["lora_fwdbwd_ms"] = lfb;
  run["lora_fwdbwd_host_ms"] = lfb_host;
  run["lora_overhead_fwdbwd"] = lfb / fb_frozen - 1;
  // The same overhead from alternating rounds of the two (frozen, then LoRA, `iters` runs each),
  // the median of the rounds' ratios: the device's clocks drift within a call (A's frozen run
  // swung between 5.1 and 5.9 ms in one run, sessions 15-17, its kernels summing to 5.1 ms at the
  // clocks ncu saw), and the two runs of a round share the conditions.
  std::vector<double> ratios, frozen_rounds, lora_rounds;
  for (int round = 0; round < kMoeRounds; ++round) {
    frozen_rounds.push_back(time(frozen_fb));
    lora_rounds.push_back(time(lora_fb));
    ratios.push_back(lora_rounds.back() / frozen_rounds.back());
  }
  run["fwdbwd_frozen_rounds_ms"] = frozen_rounds;
  run["lora_fwdbwd_rounds_ms"] = lora_rounds;
  run["lora_overhead_fwdbwd_median"] = median(ratios) - 1;
  run["lora_path"] = kconcat ? "kconcat" : "separate";
  // The same with the interleaved layout (B_gu's rows read as interleaved: a timing): its overhead
  // over the interleaved frozen run, and its time against the default layout's LoRA run, each the
  // median of alternating rounds.
  if (interleave) {
    ops::GroupedFfnParams ikp = kp;
    ikp.interleaved_gate_up = true;
    ops::GroupedFfnWeights ikw = kw;
    ikw.gate_up = kconcat ? ops::grouped_ffn_pad_weight(iw.gate_up, r) : iw.gate_up;
    const auto ilora = [&] {
      ops::grouped_ffn_forward(ctx, ikp, kx, offsets, ikw, y, lsaved);
      ops::grouped_ffn_backward(ctx, ikp, kx, offsets, ikw, lsaved, kdy, dx, lora);
    };
    std::vector<double> over, vs_default;
    for (int round = 0; round < kMoeRounds; ++round) {
      const double fz = time(ifrozen), lo = time(ilora), dl = time(lora_fb);
      over.push_back(lo / fz);
      vs_default.push_back(lo / dl);
    }
    run["lora_overhead_fwdbwd_interleaved_median"] = median(over) - 1;
    run["lora_fwdbwd_interleaved_vs_default_median"] = median(vs_default);
  }
  run["lora_fwd_kernels"] = lora_kernels_name(kp.lora_fwd);
  run["lora_bwd_kernels"] = lora_kernels_name(kp.lora_bwd);
  run["lora_out_grads_kernels"] = lora_kernels_name(kp.lora_out_grads);
  run["lora_xa_kernels"] = lora_kernels_name(kp.lora_xa);
  run["lora_dr_kernels"] = lora_kernels_name(kp.lora_dr);
  if (kconcat) {  // session 13's kernels on the same path (GroupedFfnParams::lora_s13_kernels)
    ops::GroupedFfnParams kp13 = kp;
    kp13.lora_s13_kernels = true;
    const double s13_fb = time([&] {
      ops::grouped_ffn_forward(ctx, kp13, kx, offsets, kw, y, lsaved);
      ops::grouped_ffn_backward(ctx, kp13, kx, offsets, kw, lsaved, kdy, dx, lora);
    });
    run["lora_s13_fwdbwd_ms"] = s13_fb;
    run["lora_s13_overhead_fwdbwd"] = s13_fb / fb_frozen - 1;
    // Each pass's other kernels (GroupedFfnParams::lora_fwd / lora_bwd / lora_out_grads) against
    // the run above, one pass at a time (MoeBenchOptions::lora_variants): lora_<pass>_<kernels>_
    // fwd_ms, _fwdbwd_ms, _overhead_fwdbwd.
    using K = ops::LoraKernels;
    for (const char* pass : {"fwd", "bwd", "og", "xa", "dr"})
      for (const K k : {K::Separate, K::Staged, K::Registers, K::Gemm}) {
        ops::GroupedFfnParams kv = kp;
        const std::string ps = pass;
        K& field = ps == "fwd"   ? kv.lora_fwd
                   : ps == "bwd" ? kv.lora_bwd
                   : ps == "og"  ? kv.lora_out_grads
                   : ps == "xa"  ? kv.lora_xa
                                 : kv.lora_dr;
        const std::string v = ps + "=" + lora_kernels_name(k);
        // xa has no separate form (it is one product); only xa runs inside a GEMM; dr is the GEMM
        // or not (Staged: lora_out_grads's kernels, then the GEMM).
        const bool offered = ps == "xa"   ? k != K::Separate
                             : ps == "dr" ? k == K::Gemm || k == K::Staged
                                          : k != K::Gemm;
        if (k == field || !offered || o.lora_variants == "none" ||
            (o.lora_variants != "all" &&
             ("," + o.lora_variants + ",").find("," + v + ",") == std::string::npos))
          continue;
        field = k;
        const std::string key = "lora_" + ps + "_" + lora_kernels_name(k);
        const auto vf = [&] { ops::grouped_ffn_forward(ctx, kv, kx, offsets, kw, y, lsaved); };
        const double v_f = time(vf);
        const double v_fb = time([&] {
          vf();
          ops::grouped_ffn_backward(ctx, kv, kx, offsets, kw, lsaved, kdy, dx, lora);
        });
        run[key + "_fwd_ms"] = v_f;
        run[key + "_fwdbwd_ms"] = v_fb;
        run[key + "_overhead_fwdbwd"] = v_fb / fb_frozen - 1;
      }
  }
  if (kconcat) {  // the separate passes on the same shapes, for the comparison
    const double sep_f = time(sfwd);
    const double sep_fb = time([&] {
      sfwd();
      ops::grouped_ffn_backward(ctx, lp, x, offsets, lw, lsaved, dy, dx, lora);
    });
    run["lora_separate_fwd_ms"] = sep_f;
    run["lora_separate_fwdbwd_ms"] = sep_fb;
    run["lora_separate_overhead_fwdbwd"] = sep_fb / fb_frozen - 1;
  }
  // The same forward+backward replayed from a CUDA graph: the offsets are fixed here, so the
  // problem sizes the grouped GEMMs take from their host copy hold at every replay.
  time_graph(ctx, o, frozen_fb, "graph_fwdbwd_frozen_ms", "fwdbwd_frozen_launches", run);
  time_graph(ctx, o, lora_fb, "graph_lora_fwdbwd_ms", "lora_fwdbwd_launches", run);
  if (run.contains("graph_fwdbwd_frozen_ms"))
    run["graph_saving_fwdbwd_frozen"] = 1 - run["graph_fwdbwd_frozen_ms"].get<double>() / fb_frozen;
  if (run.contains("graph_lora_fwdbwd_ms"))
    run["graph_saving_lora_fwdbwd"] = 1 - run["graph_lora_fwdbwd_ms"].get<double>() / lfb;
  // Routing, permutation and combine beside the grouped FFN, and their share of the two. A
  // failure there (memory) leaves its reason and keeps the expert timings above.
  try {
    run.update(bench_routing(ctx, tokens, topk, E, d, time));
  } catch (const Error& e) {
    run["routing_error"] = e.what();
    return run;
  }
  const double rf = run["routing_total_fwd_ms"].get<double>(),
               rfb = rf + run["routing_total_bwd_ms"].get<double>();
  run["routing_share_fwd"] = rf / (rf + f);
  run["routing_share_fwdbwd_frozen"] = rfb / (rfb + fb_frozen);
  run["routing_share_lora_fwdbwd"] = rfb / (rfb + lfb);
  return run;
}

}  // namespace

nlohmann::json run_moe_bench(const MoeBenchOptions& o, std::ostream& log) {
  MT_CHECK(cuda_available(), ValueError, "bench moe: needs a GPU (and a binary built with CUDA)");
  // The grouped GEMM configurations to compare, each run over every shape.
  std::vector<ops::GroupedGemmConfig> gemms;
  std::stringstream names(o.gemm);
  for (std::string n; std::getline(names, n, ',');)
    gemms.push_back(ops::parse_grouped_gemm_config(n));
  if (gemms.empty()) gemms.push_back(ops::grouped_gemm_config_from_env());
  if (!o.cases.empty()) {
    std::stringstream ss(o.cases);
    for (std::string c; std::getline(ss, c, ',');)
      MT_CHECK(c == "A" || c == "B" || c == "A:uniform" || c == "A:skewed" || c == "B:uniform" ||
                   c == "B:skewed",
               ValueError, "bench moe: --cases wants A, B, A:uniform, A:skewed, B:uniform or ",
               "B:skewed (comma-separated), got \"", c, "\"");
  }
  nlohmann::json j = {{"device", cuda_device_name(0)}, {"runs", nlohmann::json::array()}};
  struct Shape5 {
    const char* name;
    int64_t tokens, topk, experts, d, ffn;
  };
  for (const ops::GroupedGemmConfig& gemm : gemms)
    for (const Shape5& s :
         {Shape5{"A", 16384, 8, 64, 2048, 1024}, Shape5{"B", 8192, 8, 256, 2304, 1024}})
      for (bool skewed : {false, true}) {
        if (!moe_case_selected(o.cases, s.name, skewed)) continue;
        log << "bench moe: " << s.name << (skewed ? " skewed" : " uniform") << ", grouped GEMM "
            << ops::grouped_gemm_config_name(gemm) << "\n";
        j["runs"].push_back(
            bench_moe_at(o, gemm, s.name, s.tokens, s.topk, s.experts, s.d, s.ffn, skewed));
        log << j["runs"].back().dump() << "\n";
      }
  return j;
}

}  // namespace mt::cli
