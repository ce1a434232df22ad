// The NCCL communicator (src/parallel/nccl_comm.h) at world size 1 on one GPU, bootstrapped over
// the local comm (no MPI): every collective moves device data exactly (a world of one sums one
// value, so any difference is a transport bug), host pointers go through the staging path, a
// training step whose gradients pass through an NCCL all-reduce equals the plain GPU step bit for
// bit in deterministic mode, and a collective that cannot complete is aborted by the watchdog and
// reported with the rank, the collective and its sizes. Without a GPU it skips.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/cuda/resources.h"
#include "harness/gpu_check.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "parallel/nccl_comm.h"
#include "train/adamw.h"
#include "train/device_batch.h"

namespace mt::test {
namespace {

Tensor on_gpu(const Tensor& host, DType dt) {
  Tensor t = Tensor::empty(host.shape(), dt, Device::CUDA);
  t.copy_from(host);
  return t;
}

TEST(CudaNccl, CollectivesAtWorldOneMoveDeviceDataExactly) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  Context ctx(ContextOptions{.device = Device::CUDA, .seed = seed});
  auto boot = par::make_local_comm();
  auto nccl = par::make_nccl_comm(*boot, ctx);
  ASSERT_EQ(nccl->size(), 1);
  ASSERT_EQ(nccl->rank(), 0);
  Rng rng(seed);
  const int64_t n = 37;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor src = on_gpu(randn(rng, {n}), dt);
    const std::vector<uint8_t> want = host_bytes(src);
    const size_t es = dtype_size(dt);

    Tensor a = on_gpu(src.to(Device::CPU), dt);
    nccl->iall_reduce(a).wait();
    EXPECT_EQ(host_bytes(a), want) << "all_reduce";
    Tensor g = Tensor::zeros({n}, dt, Device::CUDA);
    nccl->iall_gather(src, g).wait();
    EXPECT_EQ(host_bytes(g), want) << "all_gather";
    Tensor r = Tensor::zeros({n}, dt, Device::CUDA);
    nccl->ireduce_scatter(src, r).wait();
    EXPECT_EQ(host_bytes(r), want) << "reduce_scatter";
    nccl->ibroadcast(a, 0).wait();
    EXPECT_EQ(host_bytes(a), want) << "broadcast";
    // 20 elements from offset 5 land at offset 10; the rest of the receive buffer is untouched.
    Tensor v = Tensor::zeros({n}, dt, Device::CUDA);
    nccl->iall_to_all_v(src, {20}, {5}, v, {20}, {10}).wait();
    const std::vector<uint8_t> got = host_bytes(v);
    for (int64_t i = 0; i < n; ++i) {
      const bool moved = i >= 10 && i < 30;
      for (size_t b = 0; b < es; ++b)
        ASSERT_EQ(got[static_cast<size_t>(i) * es + b],
                  moved ? want[static_cast<size_t>(i - 5) * es + b] : 0)
            << "all_to_all_v element " << i;
    }
  }
  // Host memory (the scalar helpers, the expert exchange's counts) goes through staging.
  EXPECT_EQ(nccl->all_reduce_sum(2.75), 2.75);
  EXPECT_EQ(nccl->all_reduce_sum(int64_t{41}), 41);
  int64_t s[4] = {5, 6, 7, 8}, d[4] = {-1, -1, -1, -1};
  nccl->iall_to_all_v(s, {2}, {1}, d, {2}, {2}, par::Elem::I64).wait();
  EXPECT_EQ(d[0], -1);
  EXPECT_EQ(d[2], 6);
  EXPECT_EQ(d[3], 7);
  nccl->barrier();
  EXPECT_EQ(nccl->stats().at(par::Collective::AllReduce).calls, 4);
  EXPECT_EQ(nccl->stats().at(par::Collective::AllGather).bytes_recv, n * (4 + 2));
  // A host tensor is refused by name: the Tensor forms take device memory.
  Tensor h = Tensor::zeros({4});
  EXPECT_THROW(nccl->iall_reduce(h), ValueError);
}

// A GPU training step of the tiny model, optionally passing every gradient through the
// communicator first (the data-parallel reduction; a world of one sums a single term).
struct StepRig {
  ModelConfig cfg;
  Model model;
  AdamW opt;
  Context ctx;
  Batch host;
  DeviceBatch staged;

  explicit StepRig(uint64_t seed)
      : cfg(ModelConfig::load("tiny")),
        model(cfg, seed, {.device = Device::CUDA}),
        opt(model.params(), {}),
        ctx(ContextOptions{.device = Device::CUDA, .seed = seed, .deterministic = true}) {
    host.seq = SeqInfo::from_lengths({70, 58});
    Rng rng(seed);
    Tensor tokens = Tensor::empty({2, 128}, DType::I32);  // ids, then targets
    for (int64_t t = 0; t < tokens.numel(); ++t)
      tokens.i32()[t] = static_cast<int32_t>(rng.below(cfg.vocab));
    host.ids = tokens.rows(0, 1).view({128}).clone();
    host.targets = tokens.rows(1, 2).view({128}).clone();
  }
  void step(par::Comm* comm) {
    const Batch& b = staged.stage(host, Device::CUDA);
    model.params().zero_grad();
    model.forward(ctx, b.seq, b.ids, b.targets);
    model.backward(ctx);
    if (comm) {
      std::vector<par::Request> pending;
      for (const auto& p : model.params().all())
        if (p->trainable()) pending.push_back(comm->iall_reduce(p->grad));
      for (par::Request& r : pending) r.wait();
    }
    opt.step(ctx, model.params(), 1e-3f);
    for (MoeLayer* m : model.moe_layers())
      if (m) m->update_selection_bias(ctx);
  }
};

TEST(CudaNccl, StepThroughNcclEqualsPlainGpuStepBitwise) {
  REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed=", seed));
  StepRig plain(seed), viaNccl(seed);
  auto boot = par::make_local_comm();
  auto nccl = par::make_nccl_comm(*boot, viaNccl.ctx);
  for (int s = 0; s < 3; ++s) {
    plain.step(nullptr);
    viaNccl.step(nccl.get());
  }
  EXPECT_GT(nccl->stats().at(par::Collective::AllReduce).calls, 0);
  const auto& a = plain.model.params().all();
  const auto& b = viaNccl.model.params().all();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(host_bytes(a[i]->value), host_bytes(b[i]->value)) << a[i]->name << " after 3 steps";
    if (a[i]->trainable()) {
      EXPECT_EQ(host_bytes(a[i]->grad), host_bytes(b[i]->grad)) << a[i]->name << " gradient";
    }
  }
  EXPECT_EQ(host_bytes(plain.model.loss()), host_bytes(viaNccl.model.loss()));
}

// The compute stream is held by a host function for 3 s, so a collective queued behind it
// cannot complete: to the watchdog, a peer that never answers. Run in a fresh process (the
// threadsafe death-test style re-executes the binary), since an aborted communicator must not
// share a CUDA context with the tests after it.
void stall_and_report() {
  Context ctx(ContextOptions{.device = Device::CUDA});
  auto boot = par::make_local_comm();
  // Initialisation keeps the default bound (a fresh process's NCCL start took over 300 ms on the
  // H200); only the collective below runs under the short one.
  auto nccl = par::make_nccl_comm(*boot, ctx);
  nccl->set_timeout(std::chrono::milliseconds(300));
  Tensor t = Tensor::zeros({1000}, DType::F32, Device::CUDA);
  cudaStream_t s = cuda_resources(ctx).stream;
  auto hold = [](void*) { std::this_thread::sleep_for(std::chrono::seconds(3)); };
  if (cudaLaunchHostFunc(s, hold, nullptr) != cudaSuccess) std::_Exit(3);
  nccl->iall_reduce(t).wait();  // stream-ordered: returns at once
  std::this_thread::sleep_for(std::chrono::seconds(1));
  try {
    nccl->barrier();
  } catch (const par::CommError& e) {
    std::fprintf(stderr, "next call: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(0);  // the job would end here; no teardown of an aborted communicator
  }
  std::_Exit(2);
}

TEST(CudaNccl, WatchdogAbortsAStalledCollectiveAndReportsIt) {
  REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(stall_and_report(), ::testing::ExitedWithCode(0),
              "moetrain: nccl world rank 0/1: all_reduce \\(sending 4000 B, receiving 4000 B\\) "
              "did not complete within 300 ms.*next call: .*CommError.*all_reduce");
}

}  // namespace
}  // namespace mt::test
