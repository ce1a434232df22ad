#include "ops/op_table.h"

#include "core/error.h"
#include "ops/attention.h"
#include "ops/cached_attention.h"
#include "ops/dispatch.h"
#include "ops/indexer.h"
#include "ops/kda.h"
#include "ops/kda_step.h"
#include "ops/sparse_mqa_attention.h"

namespace mt::ops {

const char* backend_name(Backend b) {
  return b == Backend::Cpu ? "cpu" : "cuda";
}

const char* op_name(OpKind k) {
  static constexpr EnumName<OpKind> kNames[] = {{OpKind::Gemm, "gemm"},
                                                {OpKind::KdaCore, "kda_core"},
                                                {OpKind::MlaAttention, "mla_attention"},
                                                {OpKind::SparseAttention, "sparse_attention"},
                                                {OpKind::Indexer, "indexer"},
                                                {OpKind::Router, "router"},
                                                {OpKind::MoeDispatch, "moe_dispatch"},
                                                {OpKind::GroupedExperts, "grouped_experts"},
                                                {OpKind::CrossEntropy, "cross_entropy"},
                                                {OpKind::Norm, "norm"},
                                                {OpKind::Conv1d, "conv1d"},
                                                {OpKind::KdaStep, "kda_step"},
                                                {OpKind::CachedAttention, "cached_attention"},
                                                {OpKind::CachedIndexer, "cached_indexer"}};
  static_assert(std::size(kNames) == static_cast<size_t>(OpKind::CachedIndexer) + 1);
  return name_of(kNames, k);
}

namespace {

constexpr size_t kOps = static_cast<size_t>(OpKind::CachedIndexer) + 1;
constexpr int64_t kMaxCpuKdaChunk = 256;

// Which CUDA kernels of the table exist in src/ops/cuda/: flip a flag when its kernel lands. An
// entry is built only where both hold, so a CPU-only binary plans every GPU op as a fallback.
namespace landed {
constexpr bool cublas_bf16 = true;
constexpr bool kda_chunk_cuda = true;
constexpr bool kda_direct_cuda = true;
constexpr bool flash_mla_cuda = true;
constexpr bool sparse_mla_cuda = true;
constexpr bool lightning_indexer_cuda = true;
constexpr bool fused_router_cuda = true;
constexpr bool a2a_dispatch_cuda = false;
constexpr bool grouped_gemm_cuda = true;
constexpr bool fused_ce_cuda = true;
constexpr bool rmsnorm_cuda = true;
constexpr bool causal_conv1d_cuda = true;
constexpr bool index_attention_cuda = true;
constexpr bool causal_attention_cuda = true;
constexpr bool indexer_cuda = true;
// Registered after the fast kernels above, which win where they apply: the local permute (no
// all-to-all) and the grouped experts' f32 path.
constexpr bool stable_permute_cuda = true;
constexpr bool grouped_ffn_loop_cuda = true;
constexpr bool kda_step_cuda = true;
constexpr bool cached_attention_cuda = true;
constexpr bool cached_indexer_cuda = true;
}  // namespace landed

std::string any(const OpShape&) {
  return "";
}

std::string need_bf16(const OpShape& s) {
  return s.dtype == "bf16" ? "" : "needs bf16, op is " + s.dtype;
}

std::string need_fp32(const OpShape& s) {
  return s.dtype == "fp32" ? "" : "fp32 only, op is " + s.dtype;
}

}  // namespace

void KernelRegistry::add(OpKind op, KernelImpl impl) {
  if (by_op_.size() < kOps) by_op_.resize(kOps);
  by_op_[static_cast<size_t>(op)].push_back(std::move(impl));
}

const std::vector<KernelImpl>& KernelRegistry::impls(OpKind op) const {
  MT_CHECK(static_cast<size_t>(op) < by_op_.size(), InternalError, "no kernels for op ",
           op_name(op));
  return by_op_[static_cast<size_t>(op)];
}

KernelRegistry KernelRegistry::builtin() {
  KernelRegistry r;
  auto cpu_ref = [&](OpKind op, const std::string& name, const std::string& src) {
    // The CPU ops compute in fp32; a bf16 model runs them on an fp32 copy.
    r.add(op, {name, Backend::Cpu, true, true, src, any});
  };
  auto cuda = [&](OpKind op, const std::string& name, bool has_kernel, const std::string& src,
                  std::function<std::string(const OpShape&)> accepts) {
    const bool built = MOETRAIN_WITH_CUDA && has_kernel;
    r.add(op, {name, Backend::Cuda, built, false, src, std::move(accepts)});
  };
  // Fast CPU paths first (preferred when they accept), then the references.
  r.add(OpKind::KdaCore, {"kda_chunked_cpu", Backend::Cpu, true, false, "src/ops/cpu/kda.cpp (WY)",
                          [](const OpShape& s) {
                            if (!s.chunked) return std::string("config asks for the recurrence");
                            // Each task's chunk buffers hold C x C products (C^2 + C (K + V)
                            // floats per thread): past this they outgrow the caches they are
                            // sized for, and the recurrence is the safer path.
                            if (s.chunk > kMaxCpuKdaChunk)
                              return "chunk " + std::to_string(s.chunk) + " > " +
                                     std::to_string(kMaxCpuKdaChunk);
                            return need_fp32(s);
                          }});
  cpu_ref(OpKind::KdaCore, "kda_recurrent_cpu", "src/ops/cpu/kda.cpp (token recurrence)");
  cpu_ref(OpKind::Gemm, "blas_sgemm", "src/ops/gemm.cpp");
  cpu_ref(OpKind::MlaAttention, "causal_attention_cpu", "src/ops/cpu/attention.cpp");
  cpu_ref(OpKind::SparseAttention, "index_attention_cpu", "src/ops/cpu/attention.cpp");
  cpu_ref(OpKind::Indexer, "indexer_cpu", "src/ops/cpu/indexer.cpp");
  cpu_ref(OpKind::Router, "router_cpu", "src/ops/cpu/router.cpp");
  cpu_ref(OpKind::MoeDispatch, "stable_permute_cpu", "src/ops/cpu/moe_dispatch.cpp");
  cpu_ref(OpKind::GroupedExperts, "grouped_ffn_cpu", "src/ops/grouped_ffn.cpp");
  cpu_ref(OpKind::CrossEntropy, "chunked_lm_head_ce_cpu", "src/ops/cpu/cross_entropy.cpp");
  cpu_ref(OpKind::Norm, "rmsnorm_cpu", "src/ops/cpu/norm.cpp");
  cpu_ref(OpKind::Conv1d, "causal_conv1d_cpu", "src/ops/cpu/conv1d.cpp");
  cpu_ref(OpKind::KdaStep, "kda_step_cpu", "src/ops/cpu/kda_step.cpp");
  cpu_ref(OpKind::CachedAttention, "cached_attention_cpu", "src/ops/cpu/cached_attention.cpp");
  cpu_ref(OpKind::CachedIndexer, "cached_indexer_cpu", "src/ops/cpu/cached_attention.cpp");

  // CUDA kernels (constraints as their designs state; built per the flags in `landed`).
  cuda(OpKind::Gemm, "cublas_bf16", landed::cublas_bf16, "cuBLAS", need_bf16);
  cuda(OpKind::KdaCore, "kda_chunk_cuda", landed::kda_chunk_cuda,
       "src/ops/cuda/kda_chunk.cu (chunked WY form)", [](const OpShape& s) {
         if (!s.chunked) return std::string("config asks for the recurrence");
         if (!s.kda_chunk_kernels)
           return std::string("switched off (kernels.kda = \"chunk_kernels=off\")");
         const KdaParams p{
             .head_k = s.head_dim, .head_v = s.head_dim, .chunked = s.chunked, .chunk = s.chunk};
         if (!kda_chunk_kernel_fits(p))
           return "chunk " + std::to_string(s.chunk) + " > 64 or head_dim " +
                  std::to_string(s.head_dim) + " > 128";
         return std::string();
       });
  // The direct kernel: the token recurrence for both algorithms (saving what each one saves),
  // f32 or bf16; slower than a chunked kernel, so it comes after it.
  cuda(OpKind::KdaCore, "kda_direct_cuda", landed::kda_direct_cuda,
       "src/ops/cuda/kda.cu (token recurrence)", [](const OpShape& s) {
         if (s.head_dim > 256) return "head_dim " + std::to_string(s.head_dim) + " > 256";
         return std::string();
       });
  cuda(OpKind::MlaAttention, "flash_mla_cuda", landed::flash_mla_cuda,
       "src/ops/cuda/flash_attention.cu (dense causal, tensor cores)", [](const OpShape& s) {
         if (!flash_attention_fits(s.head_dim, s.v_dim, true))
           return "head dims " + std::to_string(s.head_dim) + "/" + std::to_string(s.v_dim) +
                  " past 192/128";
         return need_bf16(s);
       });
  // The absorbed MQA form: head_dim / v_dim are the shared entry's (kv_lora_rank + rope /
  // kv_lora_rank); a LoRA adapter on kv_b_proj is merged into the absorbed weight per pass.
  cuda(OpKind::SparseAttention, "sparse_mla_cuda", landed::sparse_mla_cuda,
       "src/ops/cuda/sparse_mqa_attention.cu (absorbed MQA, tensor cores)", [](const OpShape& s) {
         if (!sparse_mqa_fits(1, s.head_dim, s.v_dim))
           return "latent entry " + std::to_string(s.head_dim) + "/" + std::to_string(s.v_dim) +
                  " is not 576/512";
         return need_bf16(s);
       });
  cuda(OpKind::Indexer, "lightning_indexer_cuda", landed::lightning_indexer_cuda,
       "src/ops/cuda/dsa_indexer_topk.cu (fused scores + top-k, tensor cores)",
       [](const OpShape& s) {
         if (!indexer_topk_fits(s.heads, s.head_dim))
           return std::to_string(s.heads) + " heads x " + std::to_string(s.head_dim) +
                  " past the fused kernel's shared memory";
         return need_bf16(s);
       });
  // The direct kernels (one block per query row over its index list or causal range): any dtype
  // and head dim, after the fused kernels, which the planner prefers where they apply.
  cuda(OpKind::MlaAttention, "causal_attention_cuda", landed::causal_attention_cuda,
       "src/ops/cuda/attention.cu (direct, causal ranges)", any);
  cuda(OpKind::SparseAttention, "index_attention_cuda", landed::index_attention_cuda,
       "src/ops/cuda/attention.cu (direct)", any);
  cuda(OpKind::Indexer, "indexer_cuda", landed::indexer_cuda, "src/ops/cuda/indexer.cu (direct)",
       any);
  cuda(OpKind::Router, "fused_router_cuda", landed::fused_router_cuda, "router top-k", any);
  cuda(OpKind::MoeDispatch, "a2a_dispatch_cuda", landed::a2a_dispatch_cuda,
       "NCCL all-to-all-v + permute", any);
  cuda(OpKind::GroupedExperts, "grouped_gemm_cuda", landed::grouped_gemm_cuda,
       "src/ops/cuda/grouped_matmul.cu + cutlass/ (CUTLASS sm90 grouped GEMMs, one launch per "
       "projection; expert LoRA K-concatenated into them up to rank 64, separate grouped "
       "products past it)",
       need_bf16);
  cuda(OpKind::CrossEntropy, "fused_ce_cuda", landed::fused_ce_cuda, "chunked fused LM head + CE",
       any);
  cuda(OpKind::Norm, "rmsnorm_cuda", landed::rmsnorm_cuda, "fused RMSNorm", any);
  cuda(OpKind::Conv1d, "causal_conv1d_cuda", landed::causal_conv1d_cuda,
       "depthwise causal conv, kernel <= 4", [](const OpShape&) { return std::string(); });
  cuda(OpKind::MoeDispatch, "stable_permute_cuda", landed::stable_permute_cuda,
       "src/ops/cuda/moe_dispatch.cu (local radix-sort permute, no all-to-all)", any);
  cuda(OpKind::GroupedExperts, "grouped_ffn_loop_cuda", landed::grouped_ffn_loop_cuda,
       "src/ops/cuda/grouped_matmul.cu (f32: cuBLAS's grouped GEMM, one launch per projection; "
       "expert LoRA as separate grouped products)",
       any);
  // Decoding's kernels: one each, so a shape they reject has no GPU path (the Decoder refuses it
  // before it allocates a cache).
  cuda(OpKind::KdaStep, "kda_step_cuda", landed::kda_step_cuda,
       "src/ops/cuda/kda_step.cu (the recurrence from a carried state)", [](const OpShape& s) {
         if (!kda_step_fits(s.head_dim))
           return "head_dim " + std::to_string(s.head_dim) +
                  " > 256 (the state tile in shared memory)";
         return std::string();
       });
  cuda(OpKind::CachedAttention, "cached_attention_cuda", landed::cached_attention_cuda,
       "src/ops/cuda/cached_attention.cu (over a KV cache)", [](const OpShape& s) {
         if (!cached_attention_fits(s.head_dim, s.v_dim))
           return "head dims " + std::to_string(s.head_dim) + "/" + std::to_string(s.v_dim) +
                  " past the kernel's shared memory";
         return std::string();
       });
  cuda(OpKind::CachedIndexer, "cached_indexer_cuda", landed::cached_indexer_cuda,
       "src/ops/cuda/cached_attention.cu (indexer scores + top-k over a cache)",
       [](const OpShape& s) {
         if (!cached_indexer_fits(s.heads, s.head_dim))
           return std::to_string(s.heads) + " heads x " + std::to_string(s.head_dim) +
                  " past the score kernel's shared memory";
         return std::string();
       });
  return r;
}

KernelChoice KernelRegistry::choose(OpKind op, Backend backend, const OpShape& shape) const {
  KernelChoice c{.op = op};
  std::string first_reject;
  const KernelImpl* ref = nullptr;
  const KernelImpl* cpu_ref = nullptr;
  for (const KernelImpl& k : impls(op)) {
    if (k.reference && k.backend == backend && !ref) ref = &k;
    if (k.reference && k.backend == Backend::Cpu && !cpu_ref) cpu_ref = &k;
    if (k.backend != backend || k.reference) continue;
    std::string why = k.built ? k.accepts(shape)
                              : "not built (no " + std::string(backend_name(backend)) +
                                    " backend in this binary)";
    if (why.empty()) {
      c.kernel = k.name;
      return c;
    }
    if (first_reject.empty()) first_reject = k.name + ": " + why;
  }
  c.fallback = true;
  c.constrained = !first_reject.empty();
  c.why = first_reject.empty() ? "no fast kernel registered" : first_reject;
  if (backend != Backend::Cpu) {
    // The CPU implementations (fp32) are the fallback of every other backend.
    OpShape cpu = shape;
    cpu.dtype = "fp32";
    const KernelChoice on_cpu = choose(op, Backend::Cpu, cpu);
    c.kernel = on_cpu.kernel;
    return c;
  }
  const KernelImpl* fb = ref ? ref : cpu_ref;
  MT_CHECK(fb, InternalError, "op ", op_name(op), " has no reference implementation");
  c.kernel = fb->name;
  return c;
}

}  // namespace mt::ops
