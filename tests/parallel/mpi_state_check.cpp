// Caller-owned expert-parallel state, run under mpirun by ctest (tests/CMakeLists.txt): on every
// rank of an EP group, two micro-batches forwarded through the same model (slots 0 and 1) before
// either backward must give exactly the losses and gradients of running them one after the other.
// The model has every layer kind; its MoE layers reach their experts through ExpertParallel, so
// the exchange's plan and the experts' saved rows live in each slot's MoE state. When the
// ExpertParallel kept them as members, the second forward re-planned the exchange and overwrote
// the first's saved rows, and the first backward read the second micro-batch's (the batches'
// token counts differ: a shape error or the wrong gradients). Exit status 0 only when every rank
// agrees; a rank that throws aborts the job (mpi_main).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/rng.h"
#include "harness/batch.h"
#include "harness/grad_bits.h"
#include "harness/model_configs.h"
#include "harness/seed.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "mpi_check.h"
#include "parallel/comm.h"
#include "parallel/expert_parallel.h"

namespace {

using namespace mt;
using Grads = test::GradBits;
using test::grad_bits;

struct Case {
  const char* name;
  ActivationRecompute recompute;
  bool lora, lifo;
  int chunks;
};

struct Args {};

// A model whose experts are split over `ep`: this rank keeps its contiguous share, and every MoE
// layer exchanges rows through its own ExpertParallel.
struct EpModel {
  EpModel(const ModelConfig& cfg, const ModelOptions& opt, par::Comm& ep, int chunks)
      : model(cfg, 21, opt) {
    const int64_t count = cfg.moe.num_experts / ep.size();
    std::vector<ExpertCompute*> computes;
    for (MoeLayer* m : model.moe_layers())
      if (m) {
        eps.push_back(std::make_unique<par::ExpertParallel>(
            ep, cfg.moe.num_experts, par::ExpertParallelOptions{.chunks = chunks}));
        computes.push_back(eps.back().get());
      }
    model.shard_experts(ep.rank() * count, count, computes);
  }
  Model model;
  std::vector<std::unique_ptr<par::ExpertParallel>> eps;
};

// Differing gradients, each named on stderr.
int differences(const Grads& want, const Grads& got, const std::string& what, int rank) {
  int bad = 0;
  if (want.size() != got.size() || want.empty()) {
    std::fprintf(stderr, "rank %d %s: %zu gradients, expected %zu\n", rank, what.c_str(),
                 got.size(), want.size());
    return 1;
  }
  for (const auto& [name, bytes] : want)
    if (got.at(name) != bytes) {
      std::fprintf(stderr, "rank %d %s: gradient of %s differs\n", rank, what.c_str(),
                   name.c_str());
      ++bad;
    }
  return bad;
}

int run_case(par::Comm& world, const Case& c, uint64_t seed) {
  const ModelConfig cfg = test::every_layer_kind(c.lora);
  const ModelOptions opt{.freeze_base = c.lora, .recompute = c.recompute};
  EpModel seq(cfg, opt, world, c.chunks), mixed(cfg, opt, world, c.chunks);
  const int rank = world.rank();
  Rng rng(seed, static_cast<uint64_t>(rank) << 32);
  if (c.lora)  // fresh adapters have B = 0: make every LoRA gradient non-trivial
    for (const auto& p : seq.model.params().all())
      if (p->spec.role == ParamRole::Lora) {
        for (int64_t i = 0; i < p->value.numel(); ++i)
          p->value.f32()[i] = 0.1f * static_cast<float>(rng.normal());
        mixed.model.params().at(p->name).value.copy_from(p->value);
      }
  // Each rank its own documents, A longer than B, and the ranks' counts differ, so the exchange
  // moves uneven rows and B's plan differs from A's.
  const Batch a = test::random_batch(rng, cfg.vocab, {19 + 3 * rank, 1, 30}, 3);
  const Batch b = test::random_batch(rng, cfg.vocab, {7, 12 - 2 * rank}, 2);
  Context ctx(ContextOptions{.threads = 1, .seed = 1});

  seq.model.params().zero_grad();
  const double la = seq.model.forward(ctx, a.seq, a.ids, a.targets);
  seq.model.backward(ctx);
  const Grads ga = grad_bits(seq.model);
  seq.model.params().zero_grad();
  const double lb = seq.model.forward(ctx, b.seq, b.ids, b.targets);
  seq.model.backward(ctx);
  const Grads gb = grad_bits(seq.model);

  Model& m = mixed.model;
  m.params().zero_grad();
  const double ma = m.forward(ctx, a.seq, a.ids, a.targets, /*slot=*/0);
  const double mb = m.forward(ctx, b.seq, b.ids, b.targets, /*slot=*/1);
  const int first = c.lifo ? 1 : 0;
  m.backward(ctx, first);
  int bad = differences(first == 1 ? gb : ga, grad_bits(m), cat(c.name, ", first backward"), rank);
  m.params().zero_grad();
  m.backward(ctx, 1 - first);
  bad += differences(first == 1 ? ga : gb, grad_bits(m), cat(c.name, ", second backward"), rank);
  if (ma != la || mb != lb) {
    std::fprintf(stderr, "rank %d %s: losses %.17g %.17g in flight, %.17g %.17g one by one\n", rank,
                 c.name, ma, mb, la, lb);
    ++bad;
  }
  return bad;
}

int run(par::Comm& world, const Args&) {
  // One base seed for the job (rank 0's), printed so that a failure can be rerun.
  auto base = static_cast<int64_t>(test::base_seed());
  world.broadcast(&base, 1, par::Elem::I64, 0);
  const auto seed = static_cast<uint64_t>(base);
  const Case cases[] = {
      {"lifo", ActivationRecompute::None, false, true, 1},
      {"fifo, 3 chunks", ActivationRecompute::None, false, false, 3},
      {"lora, 2 chunks", ActivationRecompute::None, true, true, 2},
      {"selective recompute", ActivationRecompute::Selective, false, false, 2},
      {"full recompute, lora", ActivationRecompute::Full, true, true, 3},
  };
  int64_t bad = 0;
  for (const Case& c : cases) bad += run_case(world, c, seed);
  bad = world.all_reduce_sum(bad);
  if (world.rank() == 0)
    std::printf("%s: %lld difference(s) over %zu cases on %d ranks (MOETRAIN_TEST_SEED=%llu)\n",
                bad == 0 ? "PASS" : "FAIL", static_cast<long long>(bad), std::size(cases),
                world.size(), static_cast<unsigned long long>(seed));
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return mt::test::mpi_main(
      argc, argv,
      [](int n, char** v) {
        MT_CHECK(n == 1, ValueError, "mpi_state_check takes no arguments, got ", v[1]);
        return Args{};
      },
      [](const Args&) { return mt::par::CommOptions{}; }, run);
}
