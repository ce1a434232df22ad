// A training step allocates no heap memory after warm-up: every buffer a step needs (activation
// and scratch arenas, saved layer state, loss and statistics tensors, expert loads) is planned and
// allocated by the first step. The test binary replaces the global allocation functions (operator
// new and the C allocator) with counting ones and measures whole steps of the trainer's
// LocalExecutor (zero_grad, forward + backward, AdamW, reading the step's loss, norm, auxiliary
// losses and expert loads) on the tiny preset, full and LoRA. A negative control allocates inside
// the measured region and must be seen, so a silent hook cannot pass the test.
#include <execinfo.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

#include "harness/batch.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "train/adamw.h"
#include "train/trainer.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_count{0};
thread_local bool t_in_hook = false;

// Counts one allocation; MT_ALLOC_TRACE=1 prints where it came from (diagnosis only).
void note_alloc() {
  if (!g_counting.load(std::memory_order_relaxed) || t_in_hook) return;
  g_count.fetch_add(1, std::memory_order_relaxed);
  static const bool trace = std::getenv("MT_ALLOC_TRACE") != nullptr;
  if (trace) {
    t_in_hook = true;
    void* frames[24];
    const int n = backtrace(frames, 24);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    const char sep[] = "----\n";
    (void)!write(STDERR_FILENO, sep, sizeof sep - 1);
    t_in_hook = false;
  }
}

}  // namespace

extern "C" {
void* malloc(size_t n) {
  note_alloc();
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t s) {
  note_alloc();
  return __libc_calloc(n, s);
}
void* realloc(void* p, size_t n) {
  note_alloc();
  return __libc_realloc(p, n);
}
int posix_memalign(void** p, size_t a, size_t n) {
  note_alloc();
  *p = __libc_memalign(a, n);
  return *p ? 0 : ENOMEM;
}
void* aligned_alloc(size_t a, size_t n) {
  note_alloc();
  return __libc_memalign(a, n);
}
void free(void* p) {
  __libc_free(p);
}
}

void* operator new(size_t n) {
  note_alloc();
  if (void* p = __libc_malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  return operator new(n);
}
void* operator new(size_t n, std::align_val_t a) {
  note_alloc();
  if (void* p = __libc_memalign(static_cast<size_t>(a), n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t a) {
  return operator new(n, a);
}
void operator delete(void* p) noexcept {
  __libc_free(p);
}
void operator delete[](void* p) noexcept {
  __libc_free(p);
}
void operator delete(void* p, size_t) noexcept {
  __libc_free(p);
}
void operator delete[](void* p, size_t) noexcept {
  __libc_free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  __libc_free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  __libc_free(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  __libc_free(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  __libc_free(p);
}

namespace mt {
namespace {

// Allocations made by f() on any thread.
template <typename F>
int64_t allocations_in(F&& f) {
  g_count = 0;
  g_counting = true;
  f();
  g_counting = false;
  return g_count.load();
}

Batch make_batch(const ModelConfig& cfg, uint64_t seed,
                 const std::vector<int64_t>& lengths = {29, 3, 17}) {
  Rng rng(seed);
  return test::random_batch(rng, cfg.vocab, lengths, 5);
}

struct StepReadout {
  double loss = 0, norm = 0, aux = 0;
  int64_t load = 0;
};

void check_step_allocates_nothing(bool lora) {
  ModelConfig cfg = ModelConfig::load("tiny");
  ModelOptions mo;
  if (lora) {
    const LoraSpec spec{.rank = 2, .alpha = 4.f};
    cfg.kda.lora = cfg.mla.lora = cfg.dsa.mla.lora = cfg.moe.lora = cfg.dense.lora = spec;
    cfg.moe.expert_lora = spec;
    mo.freeze_base = true;
  }
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(cat("seed=", seed, " lora=", lora));
  Model model(cfg, seed, mo);
  AdamW opt(model.params(), AdamWOptions{.weight_decay = 0.01f, .clip_norm = 0.5});
  Context ctx(ContextOptions{.seed = seed});
  LocalExecutor exec(ctx, model, opt);
  // Two micro-batches per step (gradient accumulation) with different contents.
  const Batch a = make_batch(cfg, seed), b = make_batch(cfg, seed + 1);
  StepReadout out;
  auto step = [&] {
    exec.zero_grad();
    out.loss = exec.forward_backward(a);
    out.loss += exec.forward_backward(b);
    out.norm = exec.optimizer_step(1e-3f, 0.5);
    out.aux = 0;
    for (const AuxLoss& l : exec.aux_losses()) out.aux += l.value;
    out.load = 0;
    for (const LayerLoad& l : exec.expert_load())
      for (int64_t v : l.load) out.load += v;
  };
  step();  // warm-up: the first step plans and allocates
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(allocations_in(step), 0) << "step " << s + 2;
    EXPECT_TRUE(std::isfinite(out.loss) && out.norm > 0) << out.loss << " " << out.norm;
  }
  // Negative control inside the same measured step: a longer batch re-plans the activation arena,
  // which allocates, and the hook must see it.
  const Batch longer = make_batch(cfg, seed + 2, {61, 40});
  EXPECT_GT(allocations_in([&] {
              exec.zero_grad();
              out.loss = exec.forward_backward(longer);
              out.norm = exec.optimizer_step(1e-3f, 1.0);
            }),
            0);
  step();
  // The readouts are this step's: every MoE layer counted top_k slots per token of both batches.
  int64_t moe_layers = 0;
  for (MoeLayer* m : model.moe_layers()) moe_layers += m != nullptr;
  EXPECT_EQ(out.load, moe_layers * cfg.moe.top_k * (a.seq.tokens + b.seq.tokens));
}

TEST(StepAlloc, FullTrainingStepAllocatesNothingAfterWarmup) {
  check_step_allocates_nothing(false);
}

TEST(StepAlloc, LoraTrainingStepAllocatesNothingAfterWarmup) {
  check_step_allocates_nothing(true);
}

// Negative control: the hook sees allocations from the library's own code paths, from the
// C allocator and from other threads.
TEST(StepAlloc, HookCatchesAllocationsInsideTheMeasuredRegion) {
  EXPECT_GE(allocations_in([] { Tensor t = Tensor::empty({3, 5}); }), 1);
  EXPECT_GE(allocations_in([] {
              void* p = std::malloc(24);
              std::free(p);
            }),
            1);
  EXPECT_GE(allocations_in([] {
              std::vector<int> v(7, 1);
              EXPECT_EQ(v[6], 1);
            }),
            1);
  int64_t n = allocations_in([] {
#pragma omp parallel num_threads(2)
    {
      std::vector<double> v(5);
      v[0] = 1;
    }
  });
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace mt
