// The device rule of the op entries (src/ops/dispatch.h): one device per call, chosen from the
// tensors, checked before any data is read. CUDA tensors here are views of a bogus address tagged
// Device::CUDA: an entry that touched their data would crash or hit Tensor's host-access check,
// whose message differs from the ones these tests expect.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/seq_info.h"
#include "core/tensor.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/bias.h"
#include "ops/cached_attention.h"
#include "ops/conv1d.h"
#include "ops/cross_entropy.h"
#include "ops/dispatch.h"
#include "ops/embedding.h"
#include "ops/gelu.h"
#include "ops/indexer.h"
#include "ops/kda.h"
#include "ops/kda_step.h"
#include "ops/linear.h"
#include "ops/moe_dispatch.h"
#include "ops/norm.h"
#include "ops/op_table.h"
#include "ops/optim.h"
#include "ops/patch_merge.h"
#include "ops/pos_embed.h"
#include "ops/rope2d.h"
#include "ops/router.h"
#include "ops/row_scatter.h"
#include "ops/sparse_mqa_attention.h"

namespace mt::test {
namespace {

// Never dereferenced: the address only makes the view a defined, non-empty tensor.
void* bogus() {
  static char byte;
  return &byte;
}

Tensor on_cuda(Shape shape, DType dtype = DType::F32) {
  return Tensor(bogus(), std::move(shape), dtype, Device::CUDA);
}

// Runs `call` and returns the message of the ValueError it throws ("" when it throws none).
std::string value_error(const std::function<void()>& call) {
  try {
    call();
  } catch (const ValueError& e) {
    return e.message();
  }
  return "";
}

TEST(OpDispatch, DeviceOfDefinedTensors) {
  Tensor a = Tensor::zeros({3, 4});
  Tensor b = Tensor::zeros({4});
  Tensor none;
  EXPECT_EQ(ops::op_device("t", {&a, &b, &none}), Device::CPU);
  Tensor c = on_cuda({3, 4}), d = on_cuda({2});
  EXPECT_EQ(ops::op_device("t", {&c, &none, &d}), Device::CUDA);
  // Absent optionals (undefined tensors) do not vote; with nothing defined the host runs it.
  EXPECT_EQ(ops::op_device("t", {&none}), Device::CPU);
  EXPECT_EQ(ops::op_device("t", std::vector<Tensor>{c, none, d}), Device::CUDA);
}

TEST(OpDispatch, MixedDevicesAreRefusedNamingTheOp) {
  Tensor x = Tensor::zeros({3, 4});
  Tensor w = on_cuda({4});
  const std::string msg = value_error([&] { ops::op_device("my_op", {&x, &w}); });
  EXPECT_NE(msg.find("my_op"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;

  // Through an entry: a CPU activation with a CUDA weight is refused before any data is read.
  Context ctx;
  Tensor y = Tensor::zeros({3, 4});
  Tensor rstd = Tensor::zeros({3});
  const ops::NormParams p{.rows = 3, .dim = 4};
  const std::string e = value_error([&] { ops::rmsnorm_forward(ctx, p, x, w, y, rstd); });
  EXPECT_NE(e.find("rmsnorm_forward"), std::string::npos) << e;
  EXPECT_NE(e.find("same device"), std::string::npos) << e;

  std::vector<Tensor> grads{Tensor::zeros({5}), on_cuda({5})};
  Tensor sq = Tensor::empty({1}, DType::F64);
  const std::string g = value_error([&] { ops::grad_norm_sq(ctx, grads, sq); });
  EXPECT_NE(g.find("grad_norm_sq"), std::string::npos) << g;
}

TEST(OpDispatch, ShapesAreCheckedBeforeTheDevice) {
  // Validation is written once, in the entry, and applies whatever the device.
  Context ctx;
  Tensor x = on_cuda({3, 4}), w = on_cuda({5}), y = on_cuda({3, 4}), rstd = on_cuda({3});
  const ops::NormParams p{.rows = 3, .dim = 4};
  EXPECT_THROW(ops::rmsnorm_forward(ctx, p, x, w, y, rstd), ShapeError);
}

// The op table marks a CUDA kernel built only in a CUDA binary; a CPU-only binary offers the CPU
// kernels and plans every GPU op as a fallback with that reason.
TEST(OpTable, CudaKernelsAreBuiltOnlyWithTheBackend) {
  const ops::KernelRegistry reg = ops::KernelRegistry::builtin();
  int cuda_entries = 0;
  for (int op = 0; op <= static_cast<int>(ops::OpKind::Conv1d); ++op) {
    for (const ops::KernelImpl& k : reg.impls(static_cast<ops::OpKind>(op))) {
      if (k.backend == ops::Backend::Cpu) {
        EXPECT_TRUE(k.built) << k.name;
        continue;
      }
      ++cuda_entries;
      if (!MOETRAIN_WITH_CUDA) {
        EXPECT_FALSE(k.built) << k.name;
      }
    }
  }
  EXPECT_GT(cuda_entries, 0);
  if (!MOETRAIN_WITH_CUDA) {
    const ops::KernelChoice c =
        reg.choose(ops::OpKind::Norm, ops::Backend::Cuda, {.dtype = "bf16"});
    EXPECT_TRUE(c.fallback);
    EXPECT_EQ(c.kernel, "rmsnorm_cpu");
    EXPECT_NE(c.why.find("not built"), std::string::npos) << c.why;
  } else {
    // The direct attention and indexer kernels take the shapes the fused ones refuse.
    const ops::KernelChoice sparse = reg.choose(ops::OpKind::SparseAttention, ops::Backend::Cuda,
                                                {.dtype = "fp32", .topk = 100});
    EXPECT_FALSE(sparse.fallback) << sparse.why;
    EXPECT_EQ(sparse.kernel, "index_attention_cuda");
    const ops::KernelChoice dense = reg.choose(ops::OpKind::MlaAttention, ops::Backend::Cuda,
                                               {.dtype = "fp32", .head_dim = 192, .v_dim = 128});
    EXPECT_FALSE(dense.fallback) << dense.why;
    EXPECT_EQ(dense.kernel, "causal_attention_cuda");
    // bf16 within the tensor-core kernel's widths takes it; wider heads fall to the direct one.
    EXPECT_EQ(reg.choose(ops::OpKind::MlaAttention, ops::Backend::Cuda,
                         {.dtype = "bf16", .head_dim = 192, .v_dim = 128})
                  .kernel,
              "flash_mla_cuda");
    EXPECT_EQ(reg.choose(ops::OpKind::MlaAttention, ops::Backend::Cuda,
                         {.dtype = "bf16", .head_dim = 256, .v_dim = 128})
                  .kernel,
              "causal_attention_cuda");
    EXPECT_EQ(reg.choose(ops::OpKind::Indexer, ops::Backend::Cuda, {.dtype = "fp32"}).kernel,
              "indexer_cuda");
    // bf16 indexers with head dims up to 128 take the fused kernel (the benchmark's 8 x 64 with
    // every head's q rows in shared memory, DeepSeek-V3.2's 64 x 128 six heads at a time);
    // wider heads run the direct kernels.
    EXPECT_EQ(reg.choose(ops::OpKind::Indexer, ops::Backend::Cuda,
                         {.dtype = "bf16", .head_dim = 64, .heads = 8})
                  .kernel,
              "lightning_indexer_cuda");
    EXPECT_EQ(reg.choose(ops::OpKind::Indexer, ops::Backend::Cuda,
                         {.dtype = "bf16", .head_dim = 128, .heads = 64})
                  .kernel,
              "lightning_indexer_cuda");
    EXPECT_EQ(reg.choose(ops::OpKind::Indexer, ops::Backend::Cuda,
                         {.dtype = "bf16", .head_dim = 192, .heads = 64})
                  .kernel,
              "indexer_cuda");
  }
}

#if !MOETRAIN_WITH_CUDA
// Each family's entries route CUDA tensors to the CUDA backend; a CPU-only binary says so. The
// calls have valid shapes, and their index/offset tensors hold no readable values: the error must
// come from the dispatch, before the host-side value checks.
TEST(OpDispatch, CudaTensorsInACpuOnlyBuildNameTheMissingBackend) {
  Context ctx;
  const int64_t T = 6, D = 8, H = 2, K = 4, E = 4, k = 2, V = 16;
  std::vector<std::pair<std::string, std::function<void()>>> calls;
  calls.push_back(
      {"rmsnorm_forward", [&] {
         Tensor x = on_cuda({T, D}), w = on_cuda({D}), y = on_cuda({T, D}), r = on_cuda({T});
         ops::rmsnorm_forward(ctx, {.rows = T, .dim = D}, x, w, y, r);
       }});
  calls.push_back({"silu_forward", [&] {
                     Tensor x = on_cuda({T, D}), y = on_cuda({T, D});
                     ops::silu_forward(ctx, x, y);
                   }});
  calls.push_back({"linear_forward", [&] {
                     Tensor x = on_cuda({T, D}), w = on_cuda({K, D}), y = on_cuda({T, K}), none;
                     ops::linear_forward(ctx, {.tokens = T, .in = D, .out = K}, x, w, none, none, y,
                                         none);
                   }});
  calls.push_back(
      {"embedding_forward", [&] {
         Tensor ids = on_cuda({T}, DType::I32), tab = on_cuda({V, D}), y = on_cuda({T, D});
         ops::embedding_forward(ctx, {.tokens = T, .vocab = V, .dim = D}, ids, tab, y);
       }});
  calls.push_back({"causal_conv1d_forward", [&] {
                     Tensor cu = on_cuda({2}, DType::I32), x = on_cuda({T, D}), w = on_cuda({D, 4}),
                            y = on_cuda({T, D});
                     ops::causal_conv1d_forward(ctx, {.tokens = T, .channels = D, .kernel = 4}, cu,
                                                x, w, y);
                   }});
  calls.push_back({"cached_attention_forward", [&] {
                     Tensor q = on_cuda({1, H, K}), kc = on_cuda({T, H, K}), v = on_cuda({T, H, K}),
                            pos = on_cuda({1}, DType::I32), o = on_cuda({1, H, K}), none;
                     ops::cached_attention_forward(
                         ctx, {.tokens = 1, .heads = H, .qk_dim = K, .v_dim = K, .cached = T}, q,
                         kc, v, pos, none, o);
                   }});
  calls.push_back({"cached_indexer_topk", [&] {
                     Tensor q = on_cuda({1, H, K}), kc = on_cuda({T, K}), w = on_cuda({1, H}),
                            pos = on_cuda({1}, DType::I32), o = on_cuda({1, k}, DType::I32);
                     ops::cached_indexer_topk(
                         ctx, {.tokens = 1, .heads = H, .head_dim = K, .cached = T, .topk = k}, q,
                         kc, w, pos, o);
                   }});
  calls.push_back({"kda_recurrent_step", [&] {
                     Tensor q = on_cuda({1, H, K}), g = on_cuda({1, H, K}), b = on_cuda({1, H}),
                            s = on_cuda({1, H, K, K}), o = on_cuda({1, H, K});
                     ops::kda_recurrent_step(ctx,
                                             {.tokens = 1, .heads = H, .head_k = K, .head_v = K}, q,
                                             q, q, g, b, s, o);
                   }});
  calls.push_back({"lm_head_cross_entropy_forward", [&] {
                     Tensor h = on_cuda({T, D}), w = on_cuda({V, D}), tg = on_cuda({T}, DType::I32),
                            lse = on_cuda({T}), loss = on_cuda({1}, DType::F64);
                     ops::lm_head_cross_entropy_forward(ctx, {.tokens = T, .hidden = D, .vocab = V},
                                                        h, w, tg, lse, loss);
                   }});
  calls.push_back({"attention_forward", [&] {
                     const ops::AttentionParams p{
                         .tokens = T, .heads = H, .qk_dim = K, .v_dim = K, .kmax = T, .scale = 1};
                     Tensor q = on_cuda({T, H, K}), kk = on_cuda({T, H, K}), v = on_cuda({T, H, K}),
                            idx = on_cuda({T, T}, DType::I32), o = on_cuda({T, H, K}),
                            lse = on_cuda({T, H});
                     ops::attention_forward(ctx, p, q, kk, v, idx, o, lse);
                   }});
  calls.push_back({"sparse_mqa_forward", [&] {
                     const ops::SparseMqaParams p{
                         .tokens = T, .heads = H, .qk_dim = D, .v_dim = K, .kmax = k, .scale = 1};
                     Tensor q = on_cuda({T, H, D}), kv = on_cuda({T, D}),
                            idx = on_cuda({T, k}, DType::I32), o = on_cuda({T, H, K}),
                            lse = on_cuda({T, H});
                     ops::sparse_mqa_forward(ctx, p, q, kv, idx, o, lse);
                   }});
  calls.push_back({"indexer_causal_topk", [&] {
                     Tensor q = on_cuda({T, H, K}, DType::BF16), kk = on_cuda({T, K}, DType::BF16),
                            w = on_cuda({T, H}, DType::BF16), idx = on_cuda({T, 2}, DType::I32);
                     ops::indexer_causal_topk(ctx, {.tokens = T, .heads = H, .head_dim = K},
                                              SeqInfo::uniform(1, T), q, kk, w, 2, idx);
                   }});
  // The vision ops (ops/gelu.h, bias.h, pos_embed.h, rope2d.h, patch_merge.h, full_indices).
  calls.push_back({"gelu_forward", [&] {
                     Tensor x = on_cuda({T, D}), y = on_cuda({T, D});
                     ops::gelu_forward(ctx, ops::GeluKind::Tanh, x, y);
                   }});
  calls.push_back({"bias_add_forward", [&] {
                     Tensor b = on_cuda({D}), y = on_cuda({T, D});
                     ops::bias_add_forward(ctx, b, y);
                   }});
  calls.push_back({"pos_embed_forward", [&] {
                     const ops::PosEmbedParams p{.patches = T,
                                                 .table_rows = 2,
                                                 .table_cols = 2,
                                                 .dim = D,
                                                 .mode = ops::PosInterp::Bilinear};
                     Tensor idx = on_cuda({T, 4}, DType::I32), w = on_cuda({T, 4}),
                            tab = on_cuda({2, 2, D}), x = on_cuda({T, D});
                     ops::pos_embed_forward(ctx, p, idx, w, tab, x, x);
                   }});
  calls.push_back({"rope2d_forward", [&] {
                     Tensor pos = on_cuda({T, 2}, DType::I32), x = on_cuda({T, H, K});
                     ops::rope2d_forward(ctx, {.tokens = T, .heads = H, .head_dim = K}, pos, x, x);
                   }});
  calls.push_back(
      {"patch_merge_forward", [&] {
         Tensor order = on_cuda({T}, DType::I32), x = on_cuda({T, D}), y = on_cuda({T, D});
         ops::patch_merge_forward(ctx, {.patches = T, .dim = D}, order, x, y);
       }});
  calls.push_back(
      {"row_scatter_forward", [&] {
         Tensor idx = on_cuda({T}, DType::I32), src = on_cuda({T, D}), dst = on_cuda({T, D});
         ops::row_scatter_forward(ctx, {.rows = T, .dst_rows = T, .dim = D}, idx, src, dst);
       }});
  calls.push_back({"full_indices", [&] {
                     Tensor idx = on_cuda({T, T}, DType::I32);
                     ops::full_indices(SeqInfo::uniform(1, T), idx);
                   }});
  calls.push_back(
      {"kda_forward", [&] {
         const ops::KdaParams p{.tokens = T, .heads = H, .head_k = K, .head_v = K, .num_seqs = 1};
         Tensor cu = on_cuda({2}, DType::I32), q = on_cuda({T, H, K}), kk = on_cuda({T, H, K}),
                v = on_cuda({T, H, K}), g = on_cuda({T, H, K}), beta = on_cuda({T, H}),
                o = on_cuda({T, H, K}), saved = on_cuda({1}), none;
         ops::kda_forward(ctx, p, cu, q, kk, v, g, beta, none, o, none, saved, none);
       }});
  calls.push_back({"router_forward", [&] {
                     Tensor l = on_cuda({T, E}), s = on_cuda({T, E}),
                            ids = on_cuda({T, k}, DType::I32), w = on_cuda({T, k}), none;
                     ops::router_forward(ctx, {.tokens = T, .experts = E, .top_k = k}, l, none, s,
                                         ids, w);
                   }});
  calls.push_back({"expert_load_counts", [&] {
                     Tensor ids = on_cuda({T, k}, DType::I32), c = on_cuda({E}, DType::I64);
                     ops::expert_load_counts(ctx, ids, E, c);
                   }});
  calls.push_back({"moe_dispatch_plan", [&] {
                     Tensor ids = on_cuda({T, k}, DType::I32), perm = on_cuda({T * k}, DType::I32),
                            inv = on_cuda({T * k}, DType::I32), off = on_cuda({E + 1}, DType::I32);
                     ops::moe_dispatch_plan(ctx, ids, E, perm, inv, off);
                   }});
  calls.push_back({"adamw_step", [&] {
                     Tensor p = on_cuda({D}), g = on_cuda({D}), m = on_cuda({D}), v = on_cuda({D});
                     ops::adamw_step(ctx, {}, p, g, m, v);
                   }});
  calls.push_back({"grad_norm_sq", [&] {
                     std::vector<Tensor> grads{on_cuda({D}), Tensor(), on_cuda({3})};
                     Tensor sq = on_cuda({1}, DType::F64);
                     ops::grad_norm_sq(ctx, grads, sq);
                   }});
  for (const auto& [op, call] : calls) {
    const std::string msg = value_error(call);
    EXPECT_NE(msg.find(op), std::string::npos) << op << ": " << msg;
    EXPECT_NE(msg.find("built without CUDA"), std::string::npos) << op << ": " << msg;
  }
}
#endif

}  // namespace
}  // namespace mt::test
