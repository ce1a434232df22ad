#include "plan/kernels.h"

#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace mt::plan {

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
    pick(OpKind::KdaCore, {.head_dim = cfg.kda.head_dim,
                           .chunk = cfg.kda.chunk,
                           .chunked = cfg.kda.chunked,
                           .kda_chunk_kernels = cfg.kda.kernels.chunk_kernels});
  } else {
    const MlaConfig& m = l.mixer == MixerKind::Dsa ? cfg.dsa.mla : cfg.mla;
    const int64_t hd = m.qk_nope_dim + m.qk_rope_dim;
    if (l.mixer == MixerKind::Dsa && !cfg.dsa.dense_warmup) {
      pick(OpKind::Indexer, {.head_dim = cfg.dsa.index_head_dim, .heads = cfg.dsa.index_heads});
      // The layer attends in the absorbed form (MlaLayer::absorbs): shared latent entries.
      pick(OpKind::SparseAttention, {.head_dim = m.kv_lora_rank + m.qk_rope_dim,
                                     .v_dim = m.kv_lora_rank,
                                     .topk = cfg.dsa.index_topk,
                                     .lora_rank = m.lora.rank});
    } else {
      // MLA, and DSA's dense warm-up, which attends densely (MlaLayer::selects_every_key; its KL
      // target still reads causal index lists).
      pick(OpKind::MlaAttention, {.head_dim = hd, .v_dim = m.v_head_dim});
    }
  }
  if (l.ffn == FfnKind::Moe) {
    pick(OpKind::Router, {});
    pick(OpKind::MoeDispatch, {});
    pick(OpKind::GroupedExperts, {.lora_rank = cfg.moe.expert_lora.rank});
  }
}

// The ops decoding runs for a layer in place of the training forward's (src/decode/): the KDA
// recurrence from a carried state (a prompt of many tokens takes the training core above),
// attention over the per-head KV cache, and DSA's indexer over its key cache (not in the dense
// warm-up, which attends to every cached position).
void decode_ops(const ModelConfig& cfg, const LayerIR& l,
                const std::function<void(OpKind, OpShape)>& pick) {
  if (l.mixer == MixerKind::Kda) {
    pick(OpKind::KdaStep, {.head_dim = cfg.kda.head_dim});
    return;
  }
  const MlaConfig& m = l.mixer == MixerKind::Dsa ? cfg.dsa.mla : cfg.mla;
  pick(OpKind::CachedAttention, {.head_dim = m.qk_nope_dim + m.qk_rope_dim, .v_dim = m.v_head_dim});
  if (l.mixer == MixerKind::Dsa && !cfg.dsa.dense_warmup)
    pick(OpKind::CachedIndexer, {.head_dim = cfg.dsa.index_head_dim, .heads = cfg.dsa.index_heads});
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
  // Decoding's ops depend on the mixer alone.
  seen.clear();
  for (const LayerIR& l : cfg.layers) {
    const std::string name = std::string(mixer_name(l.mixer)) + " (decoding)";
    if (seen.insert(name).second)
      decode_ops(cfg, l, [&](OpKind op, OpShape s) { pick(name, op, s); });
  }
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
      // The chunked kernels (CPU and CUDA) run the WY form; the direct CUDA kernel keeps the
      // config's algorithm (what it saves); every other KDA kernel (the reference, or any
      // fallback) runs the token recurrence. (kda_chunk_cuda was missing here: `moetrain train`
      // on a GPU ran chunked configs as the recurrence; PlanKernels' CUDA-build check found it.)
      if (op == OpKind::KdaCore)
        lk.kda = c.kernel == "kda_chunked_cpu" || c.kernel == "kda_chunk_cuda" ||
                         (c.kernel == "kda_direct_cuda" && s.chunked)
                     ? KdaImpl::Chunked
                     : KdaImpl::Recurrent;
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
