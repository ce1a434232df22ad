// The distributed trainer (src/parallel/dist_trainer.h) on one GPU over NCCL at world size 1,
// bootstrapped over the local comm (no MPI): the expert exchange (ExpertParallel over
// DispatchLayout, device buffers, NCCL all-to-all-v, staged counts), the ZeRO step (flat device
// buffers, reduce-scatter, norm, AdamW on the shard, all-gather) and FSDP units (gathers and
// reduce-scatters into device buffers) all run, degenerate but complete, and are compared with the
// plain single-GPU trainer. Without a GPU every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "harness/gpu_check.h"
#include "harness/op_check.h"
#include "harness/tolerance.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "ops/grouped_ffn.h"
#include "parallel/dist_trainer.h"
#include "parallel/expert_parallel.h"
#include "parallel/mesh.h"
#include "parallel/nccl_comm.h"
#include "train/adamw.h"
#include "train/device_batch.h"

namespace mt::test {
namespace {

double rel(const Tensor& a, const Tensor& b) {
  return rel_err(to_dvec(a.to(Device::CPU)), to_dvec(b.to(Device::CPU)));
}

Tensor gpu_randn(Rng& rng, const Shape& s, double scale) {
  return randn(rng, s, scale).to(Device::CUDA);
}

// ExpertParallel at world 1 (every expert local, the exchange a copy through NCCL) against the
// grouped FFN it wraps, on the same device rows: one chunk sorts nothing and runs the same GEMMs
// on the same rows, so it is bit for bit; three chunks split the rows, so the weight gradients
// sum the chunks' partial products in another order (the f32 bound of the longest sum).
TEST(CudaDist, ExpertExchangeOverNcclEqualsTheLocalGroupedFfn) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Context ctx(ContextOptions{.device = Device::CUDA, .seed = seed, .deterministic = true});
  auto boot = par::make_local_comm();
  auto nccl = par::make_nccl_comm(*boot, ctx);
  Rng rng(seed);
  const int64_t E = 5, l = 16, F = 12, N = 53;
  // Rows per expert, expert 2 empty (an empty segment and an empty group).
  std::vector<int64_t> count(E, 0);
  for (int64_t r = 0; r < N; ++r) {
    int64_t e = static_cast<int64_t>(rng.below(E - 1));
    count[static_cast<size_t>(e >= 2 ? e + 1 : e)]++;
  }
  Tensor offsets = Tensor::empty({E + 1}, DType::I32);  // host, as the layer hands them over
  offsets.i32()[0] = 0;
  for (int64_t e = 0; e < E; ++e)
    offsets.i32()[e + 1] = offsets.i32()[e] + static_cast<int32_t>(count[static_cast<size_t>(e)]);
  const ops::GroupedFfnParams p{.rows = N, .experts = E, .in = l, .ffn = F};
  ops::GroupedFfnWeights w{.gate_up = gpu_randn(rng, {E, 2 * F, l}, 0.3),
                           .down = gpu_randn(rng, {E, l, F}, 0.3)};
  const Tensor rows = gpu_randn(rng, {N, l}, 1.0), dout = gpu_randn(rng, {N, l}, 1.0);

  ArenaPlan plan;
  ops::grouped_ffn_plan(p, plan);
  Arena mem(plan.bytes(), Device::CUDA, "reference saved");
  ops::GroupedFfnSaved saved = ops::grouped_ffn_alloc_saved(p, mem);
  Tensor y_ref = Tensor::zeros({N, l}, DType::F32, Device::CUDA);
  Tensor dx_ref = Tensor::zeros({N, l}, DType::F32, Device::CUDA);
  ops::GroupedFfnWeights g_ref{
      .gate_up = Tensor::zeros(w.gate_up.shape(), DType::F32, Device::CUDA),
      .down = Tensor::zeros(w.down.shape(), DType::F32, Device::CUDA)};
  ops::grouped_ffn_forward(ctx, p, rows, offsets, w, y_ref, saved);
  ops::grouped_ffn_backward(ctx, p, rows, offsets, w, saved, dout, dx_ref, g_ref);

  for (int chunks : {1, 3}) {
    SCOPED_TRACE(cat(chunks, " chunk(s)"));
    par::ExpertParallel ep(*nccl, E, {.chunks = chunks});
    auto st = ep.make_state();
    Tensor y = Tensor::zeros({N, l}, DType::F32, Device::CUDA);
    Tensor dx = Tensor::zeros({N, l}, DType::F32, Device::CUDA);
    ops::GroupedFfnWeights g{.gate_up = Tensor::zeros(w.gate_up.shape(), DType::F32, Device::CUDA),
                             .down = Tensor::zeros(w.down.shape(), DType::F32, Device::CUDA)};
    // Twice: the second forward reuses the state's arena, index buffer and the shared buffers.
    for (int pass = 0; pass < 2; ++pass) {
      g.gate_up.zero_();
      g.down.zero_();
      ep.forward(ctx, p, rows, offsets, w, y, *st);
      ep.backward(ctx, p, w, dout, dx, g, *st);
    }
    EXPECT_EQ(ep.rows_received(), 2 * N);
    EXPECT_EQ(ep.buffers().allocations(), 1) << "buffers reserved once";
    EXPECT_GT(nccl->stats().at(par::Collective::AllToAllV).calls, 0);
    if (chunks == 1) {
      EXPECT_EQ(host_bytes(y), host_bytes(y_ref)) << "forward";
      EXPECT_EQ(host_bytes(dx), host_bytes(dx_ref)) << "input gradient";
      EXPECT_EQ(host_bytes(g.gate_up), host_bytes(g_ref.gate_up)) << "gate_up gradient";
      EXPECT_EQ(host_bytes(g.down), host_bytes(g_ref.down)) << "down gradient";
    } else {
      // Each output row is one chunk's GEMM row; only the weight gradients re-associate.
      EXPECT_LE(rel(y, y_ref), kF32Rel);
      EXPECT_LE(rel(dx, dx_ref), kF32Rel);
      EXPECT_LE(rel(g.gate_up, g_ref.gate_up), f32_bound(N));
      EXPECT_LE(rel(g.down, g_ref.down), f32_bound(N));
    }
  }
}

// Two documents of the tiny model's vocabulary (ids, then targets), every target valid.
Batch tiny_batch(const ModelConfig& cfg, uint64_t seed) {
  Batch host;
  host.seq = SeqInfo::from_lengths({70, 58});
  Rng rng(seed);
  Tensor tokens = Tensor::empty({2, 128}, DType::I32);
  for (int64_t t = 0; t < tokens.numel(); ++t)
    tokens.i32()[t] = static_cast<int32_t>(rng.below(cfg.vocab));
  host.ids = tokens.rows(0, 1).view({128}).clone();
  host.targets = tokens.rows(1, 2).view({128}).clone();
  host.target_tokens = 128;
  return host;
}

// No clipping: the one-process optimizer sums the squares per parameter, the ZeRO step per flat
// shard, so the two norms differ in their last bits, and a clip coefficient could round apart.
constexpr ops::AdamWOptions kAdam{.clip_norm = 0};
constexpr float kLr = 1e-3f;
constexpr int kSteps = 3;

struct PlainGpu {
  Model model;
  AdamW opt;
  Context ctx;
  DeviceBatch staged;
  PlainGpu(const ModelConfig& cfg, uint64_t seed)
      : model(cfg, seed, {.device = Device::CUDA}),
        opt(model.params(), kAdam),
        ctx(ContextOptions{.device = Device::CUDA, .seed = seed, .deterministic = true}) {}
  double step(const Batch& host) {
    const Batch& b = staged.stage(host, Device::CUDA);
    model.params().zero_grad();
    const double loss = model.forward(ctx, b.seq, b.ids, b.targets, 0, Model::Pass::Train);
    model.backward(ctx);
    opt.step(ctx, model.params(), kLr);
    for (MoeLayer* m : model.moe_layers())
      if (m) m->update_selection_bias(ctx);
    return loss;
  }
};

struct DistGpu {
  Model model;
  Context ctx;
  std::unique_ptr<par::Comm> boot, nccl;
  par::Mesh mesh;
  par::ProcessGroups groups;
  par::DistTrainer trainer;
  DeviceBatch staged;
  DistGpu(const ModelConfig& cfg, uint64_t seed, bool fsdp, int chunks,
          const par::CommOptions& copt = {}, double bucket_mib = par::DistOptions{}.bucket_mib)
      : model(cfg, seed, {.device = Device::CUDA}),
        ctx(ContextOptions{.device = Device::CUDA, .seed = seed, .deterministic = true}),
        boot(par::make_local_comm()),
        nccl(par::make_nccl_comm(*boot, ctx, copt)),
        mesh(par::make_mesh(1, 0, cfg.moe.num_experts, {.ep = 1})),
        groups(par::make_groups(*nccl, mesh)),
        trainer(model, mesh, groups,
                {.a2a_chunks = chunks,
                 .adam = kAdam,
                 .fsdp = fsdp,
                 .exchange_at_ep1 = true,
                 .bucket_mib = bucket_mib}) {}
  double step(const Batch& host) {
    const Batch& b = staged.stage(host, Device::CUDA);
    trainer.zero_grad();
    const double loss = trainer.forward_backward(ctx, b.seq, b.ids, b.targets, host.target_tokens);
    trainer.optimizer_step(ctx, kLr);
    return loss;
  }
};

// kSteps steps of both trainers on the same fresh batches: each step's (plain, distributed) loss.
std::vector<std::pair<double, double>> train_both(PlainGpu& plain, DistGpu& dist,
                                                  const ModelConfig& cfg, uint64_t seed) {
  std::vector<std::pair<double, double>> losses;
  for (int s = 0; s < kSteps; ++s) {
    const Batch host = tiny_batch(cfg, seed + static_cast<uint64_t>(s));
    const double a = plain.step(host);
    losses.emplace_back(a, dist.step(host));
  }
  return losses;
}

void expect_experts_exchanged(Model& m) {
  int exchanged = 0;
  for (MoeLayer* l : m.moe_layers())
    if (l) exchanged += dynamic_cast<par::ExpertParallel*>(l->expert_compute()) != nullptr;
  EXPECT_GT(exchanged, 0) << "the MoE layers must run through ExpertParallel";
}

// Values, and gradients of the trainable parameters, of two models bit for bit.
void expect_params_bitwise(Model& a, Model& b) {
  const auto& pa = a.params().all();
  const auto& pb = b.params().all();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(host_bytes(pa[i]->value), host_bytes(pb[i]->value)) << pa[i]->name;
    if (pa[i]->trainable()) {
      EXPECT_EQ(host_bytes(pa[i]->grad), host_bytes(pb[i]->grad)) << pa[i]->name << " gradient";
    }
  }
}

// Replicated dense parameters (no FSDP): every parameter stays its own tensor, the experts run
// through the exchange (one chunk: a copy), gradients through flat NCCL reductions and AdamW on
// the flat shard, all elementwise-identical to the one-process step: values, gradients and
// losses bit for bit in deterministic mode.
TEST(CudaDist, TrainerAtWorldOneOverNcclEqualsPlainGpuTrainerBitwise) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  const ModelConfig cfg = ModelConfig::load("tiny");
  PlainGpu plain(cfg, seed);
  DistGpu dist(cfg, seed, /*fsdp=*/false, /*chunks=*/1);
  expect_experts_exchanged(dist.model);
  for (const auto& [a, b] : train_both(plain, dist, cfg, seed)) EXPECT_EQ(a, b) << "loss";
  expect_params_bitwise(plain.model, dist.model);
  EXPECT_GT(dist.groups.world->stats().at(par::Collective::ReduceScatter).calls, 0);
}

// FSDP units (and three all-to-all chunks): the parameters become views at element offsets of the
// gathered flat buffers, 4-byte rather than 16-byte aligned, and kernels with alignment-dependent
// vector paths (flash attention's 16-byte loads) may take another path with another summation
// order; three chunks re-associate the expert weight gradients. So the model's fp32 tolerance for
// the losses (tests/harness/tolerance.h), and for the parameters that bound plus AdamW's largest
// step difference: an update is at most ~lr per element, so two runs whose gradients differ at
// rounding level differ by at most 2 lr per step where a gradient is near zero. Bitwise equality
// is reported when it holds. The sharded checkpoint pieces (copied back from the GPU) then load
// into a fresh GPU trainer that holds the same values bit for bit.
TEST(CudaDist, TrainerWithFsdpAndChunkedExchangeMatchesPlainGpuTrainer) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  const ModelConfig cfg = ModelConfig::load("tiny");
  PlainGpu plain(cfg, seed);
  DistGpu dist(cfg, seed, /*fsdp=*/true, /*chunks=*/3);
  expect_experts_exchanged(dist.model);
  bool bitwise = true;
  for (const auto& [a, b] : train_both(plain, dist, cfg, seed)) {
    EXPECT_LE(std::abs(a - b), kModelF32Rel * std::abs(a)) << "loss";
    bitwise = bitwise && a == b;
  }
  EXPECT_LE(dist.trainer.memory().fsdp_units_peak, 2);
  dist.trainer.gather_params();
  const auto& pa = plain.model.params().all();
  const auto& pb = dist.model.params().all();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::vector<double> a = to_dvec(pa[i]->value.to(Device::CPU)),
                              b = to_dvec(pb[i]->value.to(Device::CPU));
    ASSERT_EQ(a.size(), b.size()) << pa[i]->name;
    double amax = 0, diff = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      amax = std::max(amax, std::abs(a[j]));
      diff = std::max(diff, std::abs(a[j] - b[j]));
    }
    EXPECT_LE(diff, kModelF32Rel * amax + 2.0 * kLr * kSteps) << pa[i]->name;
    bitwise = bitwise && diff == 0;
  }
  std::printf("[ note ] FSDP + 3 chunks at world 1 over NCCL: %s the plain GPU trainer\n",
              bitwise ? "bitwise equal to" : "within tolerance of (not bitwise)");

  // Round trip of the sharded checkpoint pieces through a fresh trainer on the GPU.
  const std::vector<par::ShardPiece> pieces = dist.trainer.checkpoint_pieces();
  std::map<std::string, std::vector<const par::ShardPiece*>> by_name;
  for (const par::ShardPiece& sp : pieces) {
    EXPECT_EQ(sp.data.device(), Device::CPU) << sp.name;
    by_name[sp.name].push_back(&sp);
  }
  DistGpu fresh(cfg, seed + 1, /*fsdp=*/true, /*chunks=*/3);
  fresh.trainer.load_pieces(
      [&](const std::string& name, int64_t b, int64_t e, float* out) {
        for (const par::ShardPiece* sp : by_name.at(name))
          for (int64_t i = std::max(b, sp->begin); i < std::min(e, sp->end); ++i)
            out[i - b] = sp->data.f32()[i - sp->begin];
      },
      dist.trainer.optimizer_steps());
  fresh.trainer.gather_params();
  const auto& pc = fresh.model.params().all();
  for (size_t i = 0; i < pb.size(); ++i)
    EXPECT_EQ(host_bytes(pb[i]->value), host_bytes(pc[i]->value)) << pb[i]->name << " reloaded";
}

// Overlap changes when the collectives run, never what they compute: with a simulated peer delay
// of 200 us before every collective (a spin kernel on its stream) and gradient buckets of 4 KiB
// (several per step, posted during backward), on the communicators' own streams and serialised
// on the compute stream, three deterministic steps equal the plain GPU trainer bit for bit
// (losses, values, gradients), as without the delay (the test above). The device times then
// cover the delay: at least 200 us per collective, read once per step.
TEST(CudaDist, DelayedOverlappedAndSerialCollectivesKeepTheStepBitwise) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  const ModelConfig cfg = ModelConfig::load("tiny");
  constexpr int64_t kDelayUs = 200;
  constexpr double kBucketMib = 4.0 / 1024;
  PlainGpu plain(cfg, seed);
  DistGpu overlapped(cfg, seed, false, 1, {.simulated_us = kDelayUs}, kBucketMib);
  DistGpu serial(cfg, seed, false, 1, {.simulated_us = kDelayUs, .overlap = false}, kBucketMib);
  expect_experts_exchanged(overlapped.model);
  for (int s = 0; s < kSteps; ++s) {
    const Batch host = tiny_batch(cfg, seed + static_cast<uint64_t>(s));
    const double a = plain.step(host);
    EXPECT_EQ(a, overlapped.step(host)) << "loss, overlapped, step " << s;
    EXPECT_EQ(a, serial.step(host)) << "loss, serial, step " << s;
    for (DistGpu* d : {&overlapped, &serial}) {
      const par::StepMetrics& m = d->trainer.metrics();
      int64_t calls = 0;
      for (const par::CommStats* c : {&m.world, &m.ep, &m.edp}) calls += c->total().calls;
      EXPECT_GT(calls, 0);
      // Collectives still running at the step's settle count in the next step's.
      EXPECT_GE(m.device_seconds(), 0.9 * kDelayUs * 1e-6 * static_cast<double>(calls) / 2)
          << m.line(0);
    }
  }
  for (DistGpu* d : {&overlapped, &serial}) expect_params_bitwise(plain.model, d->model);
  // Several buckets, not one per communicator.
  EXPECT_GT(overlapped.groups.world->stats().at(par::Collective::ReduceScatter).calls, 2);
  std::printf("[ note ] delayed steps: %s\n[ note ]                %s\n",
              overlapped.trainer.metrics().line(0).c_str(),
              serial.trainer.metrics().line(0).c_str());
}

}  // namespace
}  // namespace mt::test
