// bench kda: the chunked KDA core forward and forward+backward at issue 12's shapes, beside
// bench/kda_fla.py's fla chunk_kda.
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "cli/bench_kernels.h"
#include "cli/bench_util.h"
#include "core/device.h"
#include "core/seq_info.h"
#include "ops/kda.h"
#include "ops/kda_gate.h"
#include "ops/kda_prep_path.h"

namespace mt::cli {

namespace {

// `run()` with one of p's kernel choices (ops::KdaKernels, ops/kda_prep_path.h) set to `value`,
// then back as it was.
template <typename F>
auto with_kernel(ops::KdaParams& p, bool ops::KdaKernels::*choice, bool value, const F& run) {
  const bool was = p.kernels.*choice;
  p.kernels.*choice = value;
  auto r = run();
  p.kernels.*choice = was;
  return r;
}

nlohmann::json bench_kda_at(const KdaBenchOptions& o, const std::string& name,
                            const std::vector<int64_t>& lengths) {
  Context ctx(gpu_options(o.workspace_gib));
  Rng rng(1);
  SeqInfo seq = SeqInfo::from_lengths(lengths);
  const int64_t T = seq.tokens, H = o.heads, D = o.head_dim, N = seq.num_seqs;
  // The runs' kernels: the defaults but for --prepared and --no-overlap; the variants below
  // change one choice each.
  ops::KdaParams p{.tokens = T, .heads = H, .head_k = D, .head_v = D, .num_seqs = N};
  p.kernels.bf16_prepared = o.prepared == "bf16";
  p.kernels.forward_overlap = !o.no_overlap;
  const int64_t rows = ops::kda_saved_rows(p, seq.cu_seqlens);
  const Tensor cu = seq.cu_seqlens.to(Device::CUDA);
  const DType bf = DType::BF16, f32 = DType::F32;
  // Unit-norm q and k rows (the layer normalises them before the core), a mild decay, beta in
  // (0, 1): the values only have to keep the arithmetic finite.
  const double unit = 1 / std::sqrt(static_cast<double>(D));
  Tensor q = random_device({T, H, D}, bf, rng, unit), k = random_device({T, H, D}, bf, rng, unit),
         v = random_device({T, H, D}, bf, rng), dout = random_device({T, H, D}, bf, rng);
  const auto constant = [](const Shape& s, float value) {
    Tensor t = Tensor::empty(s);
    std::fill(t.f32(), t.f32() + t.numel(), value);
    return t.to(Device::CUDA);
  };
  Tensor g = constant({T, H, D}, -0.05f), beta = constant({T, H}, 0.5f);
  Tensor out = Tensor::empty({T, H, D}, bf, Device::CUDA), none;
  // What forward keeps for backward, as the KDA layer keeps it under p's current kernel choices
  // (ops/kda_prep_path.h): the chunk states in kda_saved_dtype (bf16 by default), the prepared
  // blocks only with keep_prepared (off by default: backward prepares again).
  const auto saved_for = [&] {
    return Tensor::empty({rows, H, D, D}, ops::kda_saved_dtype(Device::CUDA, p, bf), Device::CUDA);
  };
  const auto prepared_for = [&] {
    return p.kernels.keep_prepared
               ? Tensor::empty({ops::kda_prepared_floats(p, rows, bf)}, f32, Device::CUDA)
               : Tensor();
  };
  Tensor saved = saved_for(), prepared = prepared_for();
  const double kept_gib = static_cast<double>(saved.bytes() + prepared.bytes()) / (1 << 30);
  Tensor dq = Tensor::empty(q.shape(), bf, Device::CUDA),
         dk = Tensor::empty(k.shape(), bf, Device::CUDA),
         dv = Tensor::empty(v.shape(), bf, Device::CUDA),
         dg = Tensor::empty(g.shape(), f32, Device::CUDA),
         dbeta = Tensor::empty(beta.shape(), f32, Device::CUDA);
  auto fwd = [&] {
    ops::kda_forward(ctx, p, cu, q, k, v, g, beta, Tensor(), out, none, saved, prepared);
  };
  auto bwd = [&] {
    ops::kda_backward(ctx, p, cu, q, k, v, g, beta, saved, prepared, dout, Tensor(), dq, dk, dv, dg,
                      dbeta, none);
  };
  auto time = [&](const std::function<void()>& f) { return mean_ms(ctx, o.warmup, o.iters, f); };
  // Backward alone cannot repeat: it overwrites the prepared block that it reads.
  const auto fwd_bwd = [&] {
    fwd();
    bwd();
  };
  const double f = time(fwd), fb = time(fwd_bwd);
  // The form before session 16 on the same inputs: the prepared blocks kept from forward to
  // backward (which then skips its prep) and fp32 chunk states.
  double f_keep = 0, fb_keep = 0, kept_gib_keep = 0;
  {
    const ops::KdaKernels defaults = p.kernels;
    p.kernels.keep_prepared = true;
    p.kernels.bf16_states = false;
    Tensor s_keep = saved_for(), p_keep = prepared_for();
    std::swap(saved, s_keep);
    std::swap(prepared, p_keep);
    f_keep = time(fwd);
    fb_keep = time(fwd_bwd);
    kept_gib_keep = static_cast<double>(saved.bytes() + prepared.bytes()) / (1 << 30);
    std::swap(saved, s_keep);
    std::swap(prepared, p_keep);
    p.kernels = defaults;
  }
  // The default form with fp32 chunk states: what the bf16 states alone change.
  double fb_f32_states = 0;
  {
    p.kernels.bf16_states = false;
    Tensor s_f32 = saved_for();
    std::swap(saved, s_f32);
    fb_f32_states = time(fwd_bwd);
    std::swap(saved, s_f32);
    p.kernels.bf16_states = true;
  }
  // An evaluation forward (no backward follows: nothing kept for it), as fla's chunk_kda under
  // torch.no_grad.
  const auto eval_fwd = [&] {
    ops::KdaParams pe = p;
    pe.keep_for_backward = false;
    ops::kda_forward(ctx, pe, cu, q, k, v, g, beta, Tensor(), out, none, saved, prepared);
  };
  const double fe = time(eval_fwd);
  // The same timings through the other kernel of one of the pairs (ops/kda_prep_path.h), so that
  // old and new compare on the same machine and inputs.
  const auto both_forwards = [&] { return std::pair(time(fwd), time(eval_fwd)); };
  const auto fwd_bwd_ms = [&] { return time(fwd_bwd); };
  const auto [f_v1, fe_v1] =
      with_kernel(p, &ops::KdaKernels::forward_state_v2, false, both_forwards);
  const auto [f_pv1, fe_pv1] = with_kernel(p, &ops::KdaKernels::prep_v2, false, both_forwards);
  // Prep, then the state pass, where the overlapped forward applies (one document of 32 heads).
  const auto [f_nov, fe_nov] =
      with_kernel(p, &ops::KdaKernels::forward_overlap, false, both_forwards);
  // The forward state pass in the grid's order instead of the longest documents first.
  const auto [f_dord, fe_dord] =
      with_kernel(p, &ops::KdaKernels::forward_longest_first, false, both_forwards);
  // The overlap in waves where the state blocks do not fit beside the prep at once (off by
  // default).
  const auto [f_ovw, fe_ovw] =
      with_kernel(p, &ops::KdaKernels::forward_overlap_waves, true, both_forwards);
  const double fb_bv1 = with_kernel(p, &ops::KdaKernels::backward_state_v2, false, fwd_bwd_ms);
  const double fb_gv1 = with_kernel(p, &ops::KdaKernels::grads_v2, false, fwd_bwd_ms);
  const double fb_pv1 = with_kernel(p, &ops::KdaKernels::products_v2, false, fwd_bwd_ms);
  // bwd_pre's work at the end of the backward's prep (KdaKernels::fused_delta,
  // KdaKernels::fused_pre: by default both jobs), or Delta alone there, or all of it by bwd_pre.
  const double fb_fused = with_kernel(p, &ops::KdaKernels::fused_delta, true, fwd_bwd_ms);
  const double fb_unfused = with_kernel(p, &ops::KdaKernels::fused_delta, false, fwd_bwd_ms);
  const double fb_delta_only = with_kernel(p, &ops::KdaKernels::fused_pre, false, fwd_bwd_ms);
  // Products v2 without its L2 prefetch.
  const double fb_pnp = with_kernel(p, &ops::KdaKernels::products_prefetch, false, fwd_bwd_ms);
  // With the decay gate in front (ops/kda_gate.h, as the KDA layer runs it: raw in the
  // activations' type, g in f32), against fla's chunk_kda with use_gate_in_kernel.
  const ops::KdaGateParams gp{.tokens = T, .heads = H, .head_dim = D};
  Tensor raw = random_device({T, H * D}, bf, rng), a_log = random_device({H}, f32, rng, 0.5),
         dt_bias = random_device({H * D}, f32, rng, 0.1), gv = g.view({T, H * D});
  Tensor draw = Tensor::empty(raw.shape(), bf, Device::CUDA),
         da_log = Tensor::zeros(a_log.shape(), f32, Device::CUDA),
         ddt_bias = Tensor::zeros(dt_bias.shape(), f32, Device::CUDA);
  const auto gate_fwd = [&] {
    ops::kda_gate_forward(ctx, gp, raw, a_log, dt_bias, gv);
    fwd();
  };
  const double gf = time(gate_fwd),
               gfb = time([&] {
                 gate_fwd();
                 bwd();
                 ops::kda_gate_backward(ctx, gp, raw, a_log, dt_bias, dg.view({T, H * D}), draw,
                                        da_log, ddt_bias);
               });
  nlohmann::json r = {{"case", name},
                      {"tokens", T},
                      {"documents", N},
                      {"H", H},
                      {"D", D},
                      {"prep_path", ops::kda_prep_path_name(ops::kda_bf16_prep_path(p))},
                      {"prepared_layout", ops::kda_chunk_layout(p, bf).half ? "bf16" : "f32"},
                      {"saved_dtype", std::string(dtype_name(saved.dtype()))},
                      {"keeps_prepared", prepared.defined()},
                      {"fwd_ms", f},
                      {"fwdbwd_ms", fb},
                      {"fwd_ms_keep_prepared", f_keep},
                      {"fwdbwd_ms_keep_prepared", fb_keep},
                      {"saved_for_backward_gib_keep_prepared", kept_gib_keep},
                      {"fwdbwd_ms_f32_states", fb_f32_states},
                      {"fwd_eval_ms", fe},
                      {"fwd_ms_state_v1", f_v1},
                      {"fwd_eval_ms_state_v1", fe_v1},
                      {"fwd_ms_prep_v1", f_pv1},
                      {"fwd_eval_ms_prep_v1", fe_pv1},
                      {"fwd_ms_no_overlap", f_nov},
                      {"fwd_eval_ms_no_overlap", fe_nov},
                      {"fwd_ms_overlap_waves", f_ovw},
                      {"fwd_ms_doc_order", f_dord},
                      {"fwd_eval_ms_doc_order", fe_dord},
                      {"fwd_eval_ms_overlap_waves", fe_ovw},
                      {"fwdbwd_ms_bwd_state_v1", fb_bv1},
                      {"fwdbwd_ms_grads_v1", fb_gv1},
                      {"fwdbwd_ms_products_v1", fb_pv1},
                      {"fwdbwd_ms_products_v2_no_prefetch", fb_pnp},
                      {"fused_delta", p.kernels.fused_delta},
                      {"fwdbwd_ms_fused_delta", fb_fused},
                      {"fwdbwd_ms_unfused_delta", fb_unfused},
                      {"fused_pre", p.kernels.fused_pre},
                      {"fwdbwd_ms_fused_delta_only", fb_delta_only},
                      {"gate_core_fwd_ms", gf},
                      {"gate_core_fwdbwd_ms", gfb},
                      {"fwd_Mtok_s", T / f / 1e3},
                      {"fwdbwd_Mtok_s", T / fb / 1e3},
                      // Kept from forward for backward beside the inputs: the states at the
                      // documents' chunk boundaries (`saved`) and, where kept, the prepared
                      // blocks.
                      {"saved_for_backward_gib", kept_gib}};
  count_launches(ctx, fwd, "launches_fwd", r);
  count_launches(ctx, bwd, "launches_bwd", r);
  return r;
}

}  // namespace

nlohmann::json run_kda_bench(const KdaBenchOptions& o, std::ostream& log) {
  // The packed case: 16 documents of mixed lengths (not multiples of the chunk), 16384 tokens in
  // all; bench/kda_fla.py lists the same.
  const std::vector<int64_t> packed = {100,  1500, 700,  2300, 64,   900, 1200, 333,
                                       1777, 450,  2048, 129,  1000, 640, 1111, 2132};
  const std::vector<std::pair<std::string, std::vector<int64_t>>> cases = {
      {"B2_T8192", {8192, 8192}}, {"B1_T65536", {65536}}, {"packed16_T16384", packed}};
  std::set<std::string> wanted;
  std::stringstream ss(o.cases);
  for (std::string item; std::getline(ss, item, ',');) {
    const bool known =
        std::any_of(cases.begin(), cases.end(), [&](const auto& c) { return c.first == item; });
    MT_CHECK(known, ValueError, "bench kda: --cases has \"", item,
             "\"; the cases are B2_T8192, B1_T65536 and packed16_T16384");
    wanted.insert(item);
  }
  MT_CHECK(o.prepared == "bf16" || o.prepared == "f32", ValueError,
           "bench kda: --prepared is bf16 or f32, not ", o.prepared);
  MT_CHECK(cuda_available(), ValueError, "bench kda: needs a GPU (and a binary built with CUDA)");
  nlohmann::json j = {{"device", cuda_device_name(0)}, {"runs", nlohmann::json::array()}};
  for (const auto& [name, lengths] : cases) {
    if (!wanted.empty() && !wanted.count(name)) continue;
    log << "bench kda: " << name << "\n";
    j["runs"].push_back(bench_kda_at(o, name, lengths));
    log << j["runs"].back().dump() << "\n";
  }
  return j;
}

}  // namespace mt::cli
