// Forward+backward time of each layer kind at the `small` preset on the CPU (one step of
// batch x seq tokens). Prints Google Benchmark JSON with --benchmark_format=json.
#include <benchmark/benchmark.h>

#include <memory>

#include "model/model.h"
#include "ops/gemm.h"

namespace {

using namespace mt;

constexpr int64_t kBatch = 2, kSeq = 256;

struct LayerBench {
  std::unique_ptr<Layer> layer;
  ParamStore store;
  SeqInfo seq;
  Tensor x, y, dy, dx;
  Arena acts;
  std::unique_ptr<LayerState> state;
};

std::unique_ptr<LayerBench> make(const std::string& which) {
  ModelConfig cfg = ModelConfig::load("small");
  auto b = std::make_unique<LayerBench>();
  if (which == "kda") b->layer = make_mixer(cfg, MixerKind::Kda);
  if (which == "dsa") b->layer = make_mixer(cfg, MixerKind::Dsa);
  if (which == "mla") b->layer = make_mixer(cfg, MixerKind::Mla);
  if (which == "moe") b->layer = make_ffn(cfg, FfnKind::Moe);
  if (which == "dense_ffn") b->layer = make_ffn(cfg, FfnKind::Dense);
  Rng rng(1);
  b->layer->bind(
      b->store.add_layer("", b->layer->param_specs(), rng, [](const ParamSpec&) { return true; }));
  b->seq = SeqInfo::uniform(kBatch, kSeq);
  const Shape act{b->seq.tokens, cfg.hidden};
  b->x = Tensor::empty(act);
  b->y = Tensor::empty(act);
  b->dy = Tensor::empty(act);
  b->dx = Tensor::empty(act);
  for (int64_t i = 0; i < b->x.numel(); ++i) {
    b->x.f32()[i] = static_cast<float>(rng.normal());
    b->dy.f32()[i] = static_cast<float>(rng.normal() * 1e-3);
  }
  ArenaPlan plan;
  b->layer->plan_activations(b->seq, plan);
  b->acts = Arena(plan.bytes(), Device::CPU, "activations");
  b->state = b->layer->make_state();
  return b;
}

void run(benchmark::State& state, const std::string& which, bool backward) {
  auto b = make(which);
  Context ctx;
  for (auto _ : state) {
    b->acts.reset();
    b->layer->forward(ctx, b->seq, b->x, b->y, b->acts, *b->state);
    if (backward) b->layer->backward(ctx, b->seq, b->dy, b->dx, *b->state);
    benchmark::DoNotOptimize(b->y.f32());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(b->seq.tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = ctx.threads();
}

// The machine's reference rate: an fp32 GEMM of the size the layers use, through the same BLAS.
void gemm_reference(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor a = Tensor::empty({n, n}), b = Tensor::empty({n, n}), c = Tensor::empty({n, n});
  Rng rng(2);
  for (int64_t i = 0; i < n * n; ++i) {
    a.f32()[i] = static_cast<float>(rng.normal());
    b.f32()[i] = static_cast<float>(rng.normal());
  }
  Context ctx;
  for (auto _ : state) {
    ops::matmul(ctx, a, false, b, true, c);
    benchmark::DoNotOptimize(c.f32());
  }
  state.counters["gflops"] = benchmark::Counter(2.0 * static_cast<double>(n * n * n) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(gemm_reference)->Arg(512)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, kda_chunked_fwd, std::string("kda"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, kda_chunked_fwd_bwd, std::string("kda"), true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, gated_dsa_fwd, std::string("dsa"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, gated_dsa_fwd_bwd, std::string("dsa"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, mla_fwd_bwd, std::string("mla"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, latent_moe_fwd, std::string("moe"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, latent_moe_fwd_bwd, std::string("moe"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, dense_ffn_fwd_bwd, std::string("dense_ffn"), true)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
