#include "plan/kernels.h"

#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace mt::plan {

const char* backend_name(Backend b) {
  return b == Backend::Cpu ? "cpu" : "cuda";
}

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::Gemm:
      return "gemm";
    case OpKind::KdaCore:
      return "kda_core";
    case OpKind::MlaAttention:
      return "mla_attention";
    case OpKind::SparseAttention:
      return "sparse_attention";
    case OpKind::Indexer:
      return "indexer";
    case OpKind::Router:
      return "router";
    case OpKind::MoeDispatch:
      return "moe_dispatch";
    case OpKind::GroupedExperts:
      return "grouped_experts";
    case OpKind::CrossEntropy:
      return "cross_entropy";
    case OpKind::Norm:
      return "norm";
    case OpKind::Conv1d:
      return "conv1d";
  }
  return "?";
}

namespace {

constexpr size_t kOps = static_cast<size_t>(OpKind::Conv1d) + 1;
constexpr int64_t kMaxCpuKdaChunk = 256;

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
  auto cuda = [&](OpKind op, const std::string& name, const std::string& src,
                  std::function<std::string(const OpShape&)> accepts) {
    r.add(op, {name, Backend::Cuda, false, false, src, std::move(accepts)});
  };
  // Fast CPU paths first (preferred when they accept), then the references.
  r.add(
      OpKind::KdaCore,
      {"kda_chunked_cpu", Backend::Cpu, true, false, "src/ops/kda.cpp (WY)", [](const OpShape& s) {
         if (!s.chunked) return std::string("config asks for the recurrence");
         // Each task's chunk buffers hold C x C products (C^2 + C (K + V)
         // floats per thread): past this they outgrow the caches they are
         // sized for, and the recurrence is the safer path.
         if (s.chunk > kMaxCpuKdaChunk)
           return "chunk " + std::to_string(s.chunk) + " > " + std::to_string(kMaxCpuKdaChunk);
         return need_fp32(s);
       }});
  cpu_ref(OpKind::KdaCore, "kda_recurrent_cpu", "src/ops/kda.cpp (token recurrence)");
  cpu_ref(OpKind::Gemm, "blas_sgemm", "src/ops/gemm.cpp");
  cpu_ref(OpKind::MlaAttention, "index_attention_cpu", "src/ops/attention.cpp");
  cpu_ref(OpKind::SparseAttention, "index_attention_cpu", "src/ops/attention.cpp");
  cpu_ref(OpKind::Indexer, "indexer_cpu", "src/ops/indexer.cpp");
  cpu_ref(OpKind::Router, "router_cpu", "src/ops/router.cpp");
  cpu_ref(OpKind::MoeDispatch, "stable_permute_cpu", "src/ops/moe_dispatch.cpp");
  cpu_ref(OpKind::GroupedExperts, "grouped_ffn_cpu", "src/ops/grouped_ffn.cpp");
  cpu_ref(OpKind::CrossEntropy, "chunked_lm_head_ce_cpu", "src/ops/cross_entropy.cpp");
  cpu_ref(OpKind::Norm, "rmsnorm_cpu", "src/ops/norm.cpp");
  cpu_ref(OpKind::Conv1d, "causal_conv1d_cpu", "src/ops/conv1d.cpp");

  // GPU kernels the plan expects (none is built yet; constraints as their designs state).
  cuda(OpKind::Gemm, "cublas_bf16", "cuBLAS", need_bf16);
  cuda(OpKind::KdaCore, "kda_chunk_cuda", "fla-style chunk_kda", [](const OpShape& s) {
    if (!s.chunked) return std::string("config asks for the recurrence");
    if (s.chunk != 64) return "chunk " + std::to_string(s.chunk) + " != 64";
    if (s.head_dim > 256) return "head_dim " + std::to_string(s.head_dim) + " > 256";
    return need_bf16(s);
  });
  cuda(OpKind::MlaAttention, "flash_mla_cuda", "flash attention over MLA heads",
       [](const OpShape& s) {
         if (s.head_dim > 256) return "head_dim " + std::to_string(s.head_dim) + " > 256";
         return need_bf16(s);
       });
  cuda(OpKind::SparseAttention, "sparse_mla_cuda", "top-k sparse MLA", [](const OpShape& s) {
    if (s.topk % 64 != 0) return "index_topk " + std::to_string(s.topk) + " not a multiple of 64";
    return need_bf16(s);
  });
  cuda(OpKind::Indexer, "lightning_indexer_cuda", "fp8/bf16 indexer scores", need_bf16);
  cuda(OpKind::Router, "fused_router_cuda", "router top-k", any);
  cuda(OpKind::MoeDispatch, "a2a_dispatch_cuda", "NCCL all-to-all-v + permute", any);
  cuda(OpKind::GroupedExperts, "grouped_gemm_cuda", "grouped GEMM (+ expert LoRA)",
       [](const OpShape& s) {
         if (s.lora_rank > 128) return "expert LoRA rank " + std::to_string(s.lora_rank) + " > 128";
         return need_bf16(s);
       });
  cuda(OpKind::CrossEntropy, "fused_ce_cuda", "chunked fused LM head + CE", any);
  cuda(OpKind::Norm, "rmsnorm_cuda", "fused RMSNorm", any);
  cuda(OpKind::Conv1d, "causal_conv1d_cuda", "depthwise causal conv, kernel <= 4",
       [](const OpShape&) { return std::string(); });
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

namespace {

std::string layer_kind(const LayerIR& l) {
  return std::string(mixer_name(l.mixer)) + (l.ffn == FfnKind::Dense ? "+ffn" : "+moe");
}

// The ops of one layer with the shapes their kernels constrain.
void layer_ops(const ModelConfig& cfg, const LayerIR& l,
               const std::function<void(OpKind, OpShape)>& pick) {
  pick(OpKind::Gemm, {});
  pick(OpKind::Norm, {});
  if (l.mixer == MixerKind::Kda) {
    pick(OpKind::Conv1d, {});
    pick(OpKind::KdaCore,
         {.head_dim = cfg.kda.head_dim, .chunk = cfg.kda.chunk, .chunked = cfg.kda.chunked});
  } else {
    const MlaConfig& m = l.mixer == MixerKind::Dsa ? cfg.dsa.mla : cfg.mla;
    const int64_t hd = m.qk_nope_dim + m.qk_rope_dim;
    if (l.mixer == MixerKind::Dsa && !cfg.dsa.dense_warmup) {
      pick(OpKind::Indexer, {.head_dim = cfg.dsa.index_head_dim});
      pick(OpKind::SparseAttention, {.head_dim = hd, .topk = cfg.dsa.index_topk});
    } else {
      pick(OpKind::MlaAttention, {.head_dim = hd});
    }
  }
  if (l.ffn == FfnKind::Moe) {
    pick(OpKind::Router, {});
    pick(OpKind::MoeDispatch, {});
    pick(OpKind::GroupedExperts, {.lora_rank = cfg.moe.expert_lora.rank});
  }
}

}  // namespace

std::vector<KernelChoice> match_kernels(const ModelConfig& cfg, Backend backend,
                                        const std::string& dtype) {
  const KernelRegistry reg = KernelRegistry::builtin();
  std::vector<KernelChoice> out;
  auto pick = [&](const std::string& layer, OpKind op, OpShape s) {
    s.dtype = dtype;
    KernelChoice c = reg.choose(op, backend, s);
    c.layer = layer;
    out.push_back(c);
  };
  std::set<std::string> seen;
  for (const LayerIR& l : cfg.layers) {
    const std::string name = layer_kind(l);
    if (!seen.insert(name).second) continue;
    layer_ops(cfg, l, [&](OpKind op, OpShape s) { pick(name, op, s); });
  }
  pick("head", OpKind::CrossEntropy, {});
  return out;
}

std::vector<LayerKernels> layer_kernels(const ModelConfig& cfg, Backend backend,
                                        const std::string& dtype) {
  const KernelRegistry reg = KernelRegistry::builtin();
  std::vector<LayerKernels> out(cfg.layers.size());
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    LayerKernels& lk = out[i];
    layer_ops(cfg, cfg.layers[i], [&](OpKind op, OpShape s) {
      s.dtype = dtype;
      const KernelChoice c = reg.choose(op, backend, s);
      // The chunked kernel is the only one that runs the WY form; every other KDA kernel
      // (the reference, or any fallback) runs the token recurrence.
      if (op == OpKind::KdaCore)
        lk.kda = c.kernel == "kda_chunked_cpu" ? KdaImpl::Chunked : KdaImpl::Recurrent;
      lk.ops.push_back({.op = op_name(op),
                        .kernel = c.kernel,
                        .reference = c.fallback,
                        .why = c.constrained ? c.why : ""});
    });
  }
  return out;
}

std::string describe_kernels(const ModelConfig& cfg, const std::vector<LayerKernels>& kernels) {
  MT_CHECK(kernels.size() == cfg.layers.size(), InternalError, "kernels for ", kernels.size(),
           " layers, the model has ", cfg.layers.size());
  // Layers grouped by kind and identical kernel lists, in order of first appearance.
  std::vector<std::pair<std::string, std::vector<size_t>>> groups;
  std::map<std::string, size_t> index;
  std::set<std::string> ref_only;
  std::ostringstream warn;
  for (size_t i = 0; i < kernels.size(); ++i) {
    std::string line = layer_kind(cfg.layers[i]) + ":";
    for (const OpKernel& o : kernels[i].ops) {
      line += " " + o.op + "=" + o.kernel;
      if (o.reference && o.why.empty()) ref_only.insert(o.op);
      if (o.reference && !o.why.empty())
        warn << "warning: layer " << i << " " << o.op << " falls back to the reference " << o.kernel
             << " (" << o.why << ")\n";
    }
    auto [it, fresh] = index.try_emplace(line, groups.size());
    if (fresh) groups.push_back({line, {}});
    groups[it->second].second.push_back(i);
  }
  std::ostringstream s;
  s << "kernels:\n";
  for (const auto& [line, layers] : groups) {
    s << "  layers";
    for (size_t k = 0; k < layers.size(); ++k) s << (k ? "," : " ") << layers[k];
    s << " " << line << "\n";
  }
  if (!ref_only.empty()) {
    s << "  reference only (no faster kernel registered for this backend):";
    for (const std::string& op : ref_only) s << " " << op;
    s << "\n";
  }
  s << warn.str();
  return s.str();
}

}  // namespace mt::plan
