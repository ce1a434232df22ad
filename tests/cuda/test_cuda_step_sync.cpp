// What a GPU training step asks of the CUDA runtime, observed from outside the engine: CUPTI's
// callback API sees every runtime and driver call the process makes (cuBLASLt's and CUB's too),
// so the counts below do not come from the engine's own bookkeeping. After warm-up a step must
// allocate and free nothing, and its blocking calls (synchronous copies, stream/device/event
// waits) must be exactly those docs/gpu.md lists under "Synchronisation points" — counted here
// from the model's structure by documented_blocking_calls(). Negative controls: an extra scalar
// read and an extra device tensor inside a step are both caught. Without a GPU it skips.
#include <cupti.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "decode/decode.h"
#include "harness/gpu_check.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "train/adamw.h"
#include "train/device_batch.h"

namespace mt::test {
namespace {

#define MT_CUPTI_CHECK(call)                                            \
  do {                                                                  \
    const CUptiResult rc_ = (call);                                     \
    if (rc_ != CUPTI_SUCCESS) {                                         \
      const char* msg_ = nullptr;                                       \
      cuptiGetResultString(rc_, &msg_);                                 \
      FAIL() << #call << ": " << (msg_ ? msg_ : "unknown CUPTI error"); \
    }                                                                   \
  } while (0)

bool is_alloc(const std::string& f) {
  return f.find("Malloc") != std::string::npos || f.find("Free") != std::string::npos ||
         f.find("HostAlloc") != std::string::npos || f.rfind("cuMemAlloc", 0) == 0 ||
         f.rfind("cuMemFree", 0) == 0 || f.rfind("cuMemCreate", 0) == 0;
}

// Calls that make the host wait for the device.
bool is_blocking(const std::string& f) {
  return f == "cudaMemcpy" || f == "cudaMemcpy2D" || f == "cudaStreamSynchronize" ||
         f == "cudaDeviceSynchronize" || f == "cudaEventSynchronize";
}

struct RuntimeLog {
  std::map<std::string, int> calls;  // runtime API entries by name
  int allocs = 0, blocking = 0;
  bool on = false;
};

void CUPTIAPI on_call(void* user, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  auto* log = static_cast<RuntimeLog*>(user);
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (!log->on || info->callbackSite != CUPTI_API_ENTER) return;
  const std::string f = info->functionName;
  ++log->calls[f];
  log->allocs += is_alloc(f);
  log->blocking += is_blocking(f);
}

// The docs' list, per step of one micro-batch (docs/gpu.md, "Synchronisation points").
int documented_blocking_calls(Model& m) {
  int moe = 0, aux = 0;
  for (MoeLayer* l : m.moe_layers()) moe += l != nullptr;
  for (int i = 0; i < m.num_layers(); ++i)
    aux += static_cast<int>(m.mixer(i).aux_terms().size() + m.ffn(i).aux_terms().size());
  return 4        // the staged batch: ids, targets, cu_seqlens, positions (host to device)
         + 1 + 1  // embedding's id check; the cross-entropy's target check
         + 1      // the loss
         + moe    // the dispatch offsets, once per MoE layer
         + 1      // the gradient norm
         + moe    // the expert loads, read after the step
         + aux;   // the auxiliary losses, read for the metrics
}

struct Rig {
  ModelConfig cfg;
  Model model;
  AdamW opt;
  Context ctx;
  Batch host;
  DeviceBatch staged;

  explicit Rig(uint64_t seed)
      : cfg(config()),
        model(cfg, seed, {.freeze_base = true, .device = Device::CUDA}),
        opt(model.params(), {}),
        ctx(ContextOptions{.device = Device::CUDA, .seed = seed}) {
    host.seq = SeqInfo::from_lengths({90, 38});
    host.ids = Tensor::empty({128}, DType::I32);
    host.targets = Tensor::empty({128}, DType::I32);
    Rng rng(seed);
    for (int64_t t = 0; t < 128; ++t) {
      host.ids.i32()[t] = static_cast<int32_t>(rng.below(cfg.vocab));
      host.targets.i32()[t] = static_cast<int32_t>(rng.below(cfg.vocab));
    }
  }
  static ModelConfig config() {
    ModelConfig c = ModelConfig::load("tiny");
    c.layers.push_back(c.layers.back());
    c.layers.back().mixer = MixerKind::Mla;
    const LoraSpec l{.rank = 2, .alpha = 4.f};
    c.kda.lora = c.mla.lora = c.dsa.mla.lora = c.moe.lora = c.dense.lora = l;
    return c;
  }
  // One step as the trainer runs it (train/trainer.cpp, LocalExecutor).
  void step() {
    const Batch& b = staged.stage(host, Device::CUDA);
    model.params().zero_grad();
    model.forward(ctx, b.seq, b.ids, b.targets);
    model.backward(ctx);
    opt.step(ctx, model.params(), 1e-3f);
    for (MoeLayer* m : model.moe_layers())
      if (m) {
        (void)m->expert_load();
        m->update_selection_bias(ctx);
      }
    (void)model.aux_losses();
  }
};

// Every runtime and driver call from now on goes to `log` (while log.on). `held` becomes true
// when another CUPTI client already holds the callbacks (compute-sanitizer, ncu): CUPTI allows one
// subscriber, so under those tools the check cannot run and the test says so instead of failing.
void watch(RuntimeLog& log, CUpti_SubscriberHandle& sub, bool& held) {
  const CUptiResult r = cuptiSubscribe(&sub, on_call, &log);
  held = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  if (held) return;
  MT_CUPTI_CHECK(r);
  MT_CUPTI_CHECK(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API));
  MT_CUPTI_CHECK(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API));
}

// In a test body: subscribe `log`, or skip the test where another CUPTI client holds the
// callbacks.
#define WATCH_OR_SKIP(log, sub)                    \
  bool held_ = false;                              \
  ASSERT_NO_FATAL_FAILURE(watch(log, sub, held_)); \
  if (held_) GTEST_SKIP() << "another CUPTI client (a sanitizer or profiler) holds the callbacks"

std::string table(const RuntimeLog& log) {
  std::string s;
  for (const auto& [f, n] : log.calls) s += cat("  ", f, " x", n, "\n");
  return s;
}

TEST(CudaStepSync, AStepAllocatesNothingAndWaitsOnlyWhereDocumented) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rig rig(seed);
  rig.step();  // warm-up: arenas, staging buffers, masters, loads on the device
  rig.step();
  RuntimeLog log;
  CUpti_SubscriberHandle sub{};
  WATCH_OR_SKIP(log, sub);

  log.on = true;
  rig.step();
  log.on = false;
  const RuntimeLog good = log;
  std::printf("runtime and driver calls of one step:\n%s", table(good).c_str());
  EXPECT_EQ(good.allocs, 0) << table(good);
  EXPECT_EQ(good.blocking, documented_blocking_calls(rig.model)) << table(good);

  // Negative controls: the same step plus one hidden read, then plus one device allocation.
  log = RuntimeLog{};
  log.on = true;
  rig.step();
  (void)read_scalar(rig.model.loss());
  log.on = false;
  EXPECT_EQ(log.blocking, good.blocking + 1) << "an extra read_scalar went unseen";
  log = RuntimeLog{};
  log.on = true;
  rig.step();
  { Tensor extra = Tensor::empty({1024}, DType::F32, Device::CUDA); }
  log.on = false;
  EXPECT_GE(log.allocs, 1) << "an extra device allocation went unseen";
  MT_CUPTI_CHECK(cuptiUnsubscribe(sub));
}

// A decode step (one generated token) after warm-up: no allocation, and exactly the waits of
// docs/gpu.md, "Decoding": the staged inputs, the embedding's id check, the MoE layers' dispatch
// offsets and the logits' copy to the host.
TEST(CudaStepSync, ADecodeStepWaitsOnlyWhereDocumented) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Rig rig(seed);
  Decoder dec(rig.model, 40);
  Tensor prompt = Tensor::empty({20}, DType::I32), one = Tensor::empty({1}, DType::I32);
  for (int64_t i = 0; i < 20; ++i) prompt.i32()[i] = static_cast<int32_t>(i % rig.cfg.vocab);
  one.i32()[0] = 3;
  Tensor row = Tensor::empty({1, rig.cfg.vocab});
  dec.step(rig.ctx, prompt, row);  // warm-up: the FFN arena, sized by the prompt
  dec.step(rig.ctx, one, row);
  RuntimeLog log;
  CUpti_SubscriberHandle sub{};
  WATCH_OR_SKIP(log, sub);
  log.on = true;
  dec.step(rig.ctx, one, row);
  log.on = false;
  MT_CUPTI_CHECK(cuptiUnsubscribe(sub));
  int moe = 0;
  for (MoeLayer* l : rig.model.moe_layers()) moe += l != nullptr;
  EXPECT_EQ(log.allocs, 0) << table(log);
  EXPECT_EQ(log.blocking, 3 + moe) << table(log);
}

}  // namespace
}  // namespace mt::test
