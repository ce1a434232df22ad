// The distributed training step allocates no heap memory after warm-up, on every rank: the
// mpirun counterpart of tests/train/test_step_alloc.cpp, run by ctest (tests/CMakeLists.txt).
// Each rank builds the DistExecutor of the tiny preset (experts over `--ep` ranks, LoRA, FSDP
// units and ZeRO-3 experts when asked), runs warm-up steps, then counts the allocations
// (tests/harness/alloc_hooks.h) of whole steps: zero_grad, two micro-batches of forward + backward
// (the expert exchange included), the ZeRO step, the averaged auxiliary losses and the expert
// loads. Open MPI allocates inside its own calls (libnbc builds a schedule per nonblocking
// collective) and on its own threads; those allocations are beyond the engine's control and are
// left out: an allocation counts unless its call stack passes through the MPI library or its
// runtime, so every allocation of our code, the communicator's requests included, still counts. Two
// negative controls must be seen on every rank: a tensor allocated inside a measured step, and a
// longer batch, which re-plans the activation arena. A rank that fails names itself and its count.
#include "harness/alloc_hooks.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/rng.h"
#include "harness/batch.h"
#include "model/model.h"
#include "mpi_check.h"
#include "parallel/comm.h"
#include "train/dist_executor.h"
#include "train/job.h"

namespace {

using namespace mt;
using test::alloc_hooks::allocations_in;

struct Args {
  int ep = 1, chunks = 1;
  int bucket_kib = 0;  // gradient buckets of this many KiB (DistOptions::bucket_mib); 0: default
  bool lora = false, fsdp = false, shard_expert_weights = false;
};

// --ep N, --chunks N, --bucket-kib N, --lora, --fsdp, --shard-expert-weights.
Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    bool* flag = k == "--lora"                   ? &a.lora
                 : k == "--fsdp"                 ? &a.fsdp
                 : k == "--shard-expert-weights" ? &a.shard_expert_weights
                                                 : nullptr;
    if (flag) {
      *flag = true;
      continue;
    }
    int* v = k == "--ep"           ? &a.ep
             : k == "--chunks"     ? &a.chunks
             : k == "--bucket-kib" ? &a.bucket_kib
                                   : nullptr;
    MT_CHECK(v, ValueError, "unknown argument ", k);
    MT_CHECK(i + 1 < argc, ValueError, "missing value after ", k);
    *v = std::atoi(argv[++i]);
  }
  return a;
}

// Every rank holds the same number of tokens (DistTrainer's rule), in documents of its own.
Batch rank_batch(const ModelConfig& cfg, uint64_t seed, int rank,
                 const std::vector<int64_t>& lengths) {
  Rng rng(seed + 7919 * static_cast<uint64_t>(rank));
  return test::random_batch(rng, cfg.vocab, lengths, 5);
}

int run(par::Comm& world, const Args& a, uint64_t seed) {
  const int rank = world.rank();
  ModelConfig cfg = ModelConfig::load("tiny");
  ModelOptions mo;
  if (a.lora) {
    const LoraSpec spec{.rank = 2, .alpha = 4.f};
    cfg.kda.lora = cfg.mla.lora = cfg.dsa.mla.lora = cfg.moe.lora = cfg.dense.lora = spec;
    cfg.moe.expert_lora = spec;
    mo.freeze_base = true;
  }
  Job job;
  job.ep = a.ep;
  job.a2a_chunks = a.chunks;
  job.fsdp = a.fsdp;
  job.shard_expert_weights = a.shard_expert_weights;
  // Two micro-batches per step (below): the gradient buckets are posted in the second one's
  // backward.
  job.grad_accum = 2;
  DistSetup setup(world, cfg, job);
  if (a.bucket_kib > 0) setup.bucket_mib = a.bucket_kib / 1024.0;
  Model model(cfg, seed, mo);
  Context ctx(ContextOptions{.threads = 1, .seed = seed});
  auto exec =
      make_dist_executor(ctx, model, setup, AdamWOptions{.weight_decay = 0.01f, .clip_norm = 0.5});
  // Two micro-batches per step (gradient accumulation) with different contents.
  const Batch b1 = rank_batch(cfg, seed, rank, {29, 3, 17}),
              b2 = rank_batch(cfg, seed + 1, rank, {11, 30, 8});
  double loss = 0, norm = 0, aux = 0;
  int64_t load = 0;
  auto step = [&] {
    exec->zero_grad();
    loss = exec->forward_backward(b1);
    loss += exec->forward_backward(b2);
    norm = exec->optimizer_step(1e-3f, 0.5);
    aux = 0;
    for (const AuxLoss& l : exec->aux_losses()) aux += l.value;
    load = 0;
    for (const LayerLoad& l : exec->expert_load())
      for (int64_t v : l.load) load += v;
  };
  // Warm-up: the first steps plan and allocate (the exchange's buffers, the communicator's
  // requests up to the most in flight at once).
  for (int s = 0; s < 2; ++s) step();
  int failures = 0;
  constexpr int kSteps = 3;
  for (int s = 0; s < kSteps; ++s) {
    const int64_t n = allocations_in(step, /*skip_mpi=*/true);
    if (n != 0 || !std::isfinite(loss) || !(norm > 0) || !std::isfinite(aux)) {
      std::fprintf(stderr,
                   "rank %d: step %d after warm-up allocated %lld times (loss %g, norm %g)\n", rank,
                   s + 3, static_cast<long long>(n), loss, norm);
      ++failures;
    }
  }
  // Negative controls, each a whole step on every rank (the exchange needs every rank).
  const int64_t extra = allocations_in(
      [&] {
        step();
        Tensor t = Tensor::empty({3, 5});
        t.f32()[0] = 1;
      },
      true);
  const Batch longer = rank_batch(cfg, seed + 2, rank, {61, 40});
  const int64_t replan = allocations_in(
      [&] {
        exec->zero_grad();
        loss = exec->forward_backward(longer);
        norm = exec->optimizer_step(1e-3f, 1.0);
      },
      true);
  if (extra < 1 || replan < 1) {
    std::fprintf(stderr,
                 "rank %d: negative controls not seen: %lld allocations with a tensor allocated, "
                 "%lld with a longer batch\n",
                 rank, static_cast<long long>(extra), static_cast<long long>(replan));
    ++failures;
  }
  // The readouts are the step's: every MoE layer counted top_k slots per token of every rank.
  step();
  int64_t moe_layers = 0;
  for (MoeLayer* m : model.moe_layers()) moe_layers += m != nullptr;
  const int64_t want = moe_layers * cfg.moe.top_k * (b1.seq.tokens + b2.seq.tokens) * world.size();
  if (load != want) {
    std::fprintf(stderr, "rank %d: expert loads sum to %lld, expected %lld\n", rank,
                 static_cast<long long>(load), static_cast<long long>(want));
    ++failures;
  }
  const int64_t bad = world.all_reduce_sum(static_cast<int64_t>(failures ? 1 : 0));
  if (rank == 0)
    std::printf("%s: %lld of %d ranks allocated inside a step or missed a control\n",
                bad ? "FAIL" : "PASS", static_cast<long long>(bad), world.size());
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mt::test::mpi_main(
      argc, argv, parse, [](const Args&) { return mt::par::CommOptions{}; }, run);
}
