#include "plan/model_stats.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "model/kda_layer.h"
#include "ops/cross_entropy.h"
#include "ops/grouped_ffn.h"
#include "ops/grouped_matmul.h"
#include "ops/indexer.h"
#include "ops/kda.h"

namespace mt::plan {

namespace {

constexpr EnumName<Recompute> kRecomputeNames[] = {
    {Recompute::None, "none"}, {Recompute::Selective, "selective"}, {Recompute::Full, "full"}};
static_assert(std::size(kRecomputeNames) == static_cast<size_t>(Recompute::Full) + 1);
constexpr EnumName<Engine> kEngineNames[] = {
    {Engine::Fsdp, "fsdp"}, {Engine::Zero1Ep, "zero1+ep"}, {Engine::FsdpEp, "fsdp+ep"}};
static_assert(std::size(kEngineNames) == static_cast<size_t>(Engine::FsdpEp) + 1);

}  // namespace

const char* recompute_name(Recompute r) {
  return name_of(kRecomputeNames, r);
}

Recompute parse_recompute(const std::string& s) {
  const std::optional<Recompute> r = value_of(kRecomputeNames, s);
  MT_CHECK(r, ValueError, "recompute policy must be none, selective or full, got '", s, "'");
  return *r;
}

nlohmann::json ParallelPlan::to_json() const {
  return {{"world", world},
          {"gpus_per_node", gpus_per_node},
          {"fsdp", fsdp},
          {"ep", ep},
          {"replicas", replicas},
          {"expert_shard", expert_shard},
          {"mbs", mbs},
          {"seq", seq},
          {"recompute", recompute_name(recompute)},
          {"a2a_chunks", a2a_chunks},
          {"engine", engine_name(engine)}};
}

const char* engine_name(Engine e) {
  return name_of(kEngineNames, e);
}

Engine parse_engine(const std::string& s) {
  const std::optional<Engine> e = value_of(kEngineNames, s);
  MT_CHECK(e, ValueError, "unknown engine '", s, "' (expected fsdp, zero1+ep or fsdp+ep)");
  return *e;
}

ModelConfig with_lora(ModelConfig cfg, const LoraOptions& lora) {
  const LoraSpec s{.rank = lora.rank, .alpha = lora.alpha};
  cfg.kda.lora = s;
  cfg.mla.lora = s;
  cfg.dsa.mla.lora = s;
  cfg.moe.lora = s;
  cfg.dense.lora = s;
  cfg.moe.expert_lora = LoraSpec{.rank = lora.expert_rank, .alpha = lora.alpha};
  return cfg;
}

const char* component_name(Component c) {
  static constexpr const char* kNames[] = {
      "embedding",     "lm_head",        "norms",  "kda",         "mla_attention",
      "dsa_attention", "indexer",        "router", "latent",      "shared_experts",
      "dense_ffn",     "routed_experts", "lora",   "expert_lora", "vision"};
  static_assert(std::size(kNames) == kComponents);
  return kNames[static_cast<size_t>(c)];
}

namespace {

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

}  // namespace

Component classify(const ModelConfig& cfg, const NamedSpec& s) {
  const std::string& n = s.name;
  if (n == "model.embed_tokens.weight") return Component::Embedding;
  if (n == "lm_head.weight") return Component::LmHead;
  if (n == "model.norm.weight") return Component::Norms;
  if (starts_with(n, "model.vision_tower.") || starts_with(n, "model.mm_projector."))
    return Component::Vision;
  const std::string layers = "model.layers.";
  MT_CHECK(starts_with(n, layers), InternalError, "parameter '", n, "' belongs to no component");
  const size_t dot = n.find('.', layers.size());
  const size_t li = std::stoul(n.substr(layers.size(), dot - layers.size()));
  MT_CHECK(li < cfg.layers.size(), InternalError, "parameter '", n, "' names a missing layer");
  const std::string rest = n.substr(dot + 1);
  if (s.spec.role == ParamRole::Lora)
    return starts_with(rest, "mlp.experts.") ? Component::ExpertLora : Component::Lora;
  if (starts_with(rest, "input_layernorm.") || starts_with(rest, "post_attention_layernorm."))
    return Component::Norms;
  if (starts_with(rest, "self_attn.indexer.")) return Component::Indexer;
  if (starts_with(rest, "self_attn.")) {
    switch (cfg.layers[li].mixer) {
      case MixerKind::Kda:
        return Component::Kda;
      case MixerKind::Dsa:
        return Component::DsaAttention;
      case MixerKind::Mla:
        return Component::MlaAttention;
    }
  }
  if (cfg.layers[li].ffn == FfnKind::Dense && starts_with(rest, "mlp.")) return Component::DenseFfn;
  if (starts_with(rest, "mlp.gate.")) return Component::Router;
  if (starts_with(rest, "mlp.latent_")) return Component::Latent;
  if (starts_with(rest, "mlp.shared_experts.")) return Component::SharedExperts;
  if (starts_with(rest, "mlp.experts.")) return Component::RoutedExperts;
  MT_THROW(InternalError, "parameter '", n, "' belongs to no component");
}

bool is_trainable(const ParamSpec& s, bool freeze_base) {
  if (s.role == ParamRole::Buffer) return false;
  return !freeze_base || s.role == ParamRole::Lora;
}

bool is_expert(const NamedSpec& s) {
  return s.spec.per_expert;
}

namespace {

// Block index of a "model.layers.N." name, or -1.
int64_t layer_of(const std::string& name) {
  const std::string pre = "model.layers.";
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  return std::stoll(name.substr(pre.size(), name.find('.', pre.size()) - pre.size()));
}

}  // namespace

ParamCounts count_params(const ModelConfig& cfg, bool freeze_base, const Precision& precision) {
  ParamCounts c;
  c.precision = precision;
  int64_t expert_all = 0;
  const size_t L = cfg.layers.size();
  // Units: blocks 0..L-1, then one per top-level tensor.
  std::vector<int64_t> unit(L, 0), unit_tr(L, 0), ex(L, 0), ex_tr(L, 0), unit_b(L, 0), ex_b(L, 0);
  for (const NamedSpec& s : model_param_specs(cfg, precision)) {
    const int64_t n = s.spec.shape.numel();
    const int64_t bytes = n * static_cast<int64_t>(dtype_size(s.spec.dtype));
    const bool tr = is_trainable(s.spec, freeze_base);
    const int64_t li = layer_of(s.name);
    c.weight_bytes += bytes;
    if (s.spec.role == ParamRole::Buffer) {
      c.buffers += n;
      c.buffer_bytes += bytes;
    }
    if (li < 0) {
      c.largest_unit = std::max(c.largest_unit, n);
      c.largest_unit_bytes = std::max(c.largest_unit_bytes, bytes);
      if (tr) c.largest_unit_trainable = std::max(c.largest_unit_trainable, n);
    } else {
      auto& u = is_expert(s) ? ex : unit;
      auto& ut = is_expert(s) ? ex_tr : unit_tr;
      auto& ub = is_expert(s) ? ex_b : unit_b;
      u[static_cast<size_t>(li)] += n;
      ub[static_cast<size_t>(li)] += bytes;
      if (tr) ut[static_cast<size_t>(li)] += n;
    }
    ComponentCount& cc = c.by_component[static_cast<size_t>(classify(cfg, s))];
    cc.params += n;
    c.total += n;
    if (tr) {
      cc.trainable += n;
      c.trainable += n;
      // Stored fp32 under a narrower policy (ParamSpec::keep_fp32): AdamW keeps no master.
      if (s.spec.dtype == DType::F32 && precision.masters()) c.trainable_fp32 += n;
    }
    if (is_expert(s)) {
      expert_all += n;
      c.expert_bytes += bytes;
      if (tr) c.expert_trainable += n;
    }
  }
  c.expert = expert_all;
  for (size_t i = 0; i < L; ++i) {
    c.largest_unit_bytes = std::max(c.largest_unit_bytes, unit_b[i]);
    c.expert_layer_bytes = std::max(c.expert_layer_bytes, ex_b[i]);
    c.largest_unit = std::max(c.largest_unit, unit[i]);
    c.largest_unit_trainable = std::max(c.largest_unit_trainable, unit_tr[i]);
    c.expert_layer = std::max(c.expert_layer, ex[i]);
    c.expert_layer_trainable = std::max(c.expert_layer_trainable, ex_tr[i]);
  }
  const int64_t E = std::max<int64_t>(cfg.moe.num_experts, 1);
  c.active_per_token = c.total - expert_all + expert_all / E * cfg.moe.top_k;
  return c;
}

BytesPerElement bytes_per_element(const Precision& p) {
  return {.weight = static_cast<double>(dtype_size(p.weights)),
          .grad = Precision::kGradBytes,
          .master = p.masters() ? static_cast<double>(Precision::kMasterBytes) : 0,
          .optim = Precision::kMomentBytes,
          .act = static_cast<double>(dtype_size(p.activations))};
}

size_t BlockActs::saved(Recompute r) const {
  switch (r) {
    case Recompute::None:
      return all();
    case Recompute::Selective:
      return boundary + mixer_bytes;
    case Recompute::Full:
      return input;
  }
  return all();
}

std::vector<BlockActs> block_activations(const ModelConfig& cfg, int64_t mbs, int64_t seq,
                                         DType activations, Device device) {
  MT_CHECK(mbs > 0 && seq > 0, ValueError, "micro-batch and sequence length must be positive, got ",
           mbs, " x ", seq);
  const SeqInfo si = SeqInfo::uniform(mbs, seq);
  const int64_t T = si.tokens, d = cfg.hidden;
  // What Model::plan keeps around each block: normed input + rstd, mixer output (= residual),
  // normed mid + rstd, FFN output (= next residual). A test checks the sum against the model.
  ArenaPlan b(activations, device);
  for (int i = 0; i < 4; ++i) b.add({T, d});
  for (int i = 0; i < 2; ++i) b.add_fp32({T});
  ArenaPlan in(activations, device);
  in.add({T, d});
  std::map<int, size_t> mixer_bytes, ffn_bytes;
  std::vector<BlockActs> out;
  for (const LayerIR& l : cfg.layers) {
    const int mk = static_cast<int>(l.mixer), fk = static_cast<int>(l.ffn);
    if (!mixer_bytes.count(mk)) {
      ArenaPlan p(activations, device);
      make_mixer(cfg, l.mixer)->plan_activations(si, p);
      mixer_bytes[mk] = p.bytes();
    }
    if (!ffn_bytes.count(fk)) {
      ArenaPlan p(activations, device);
      make_ffn(cfg, l.ffn)->plan_activations(si, p);
      ffn_bytes[fk] = p.bytes();
    }
    out.push_back({.mixer = l.mixer,
                   .ffn = l.ffn,
                   .boundary = b.bytes(),
                   .mixer_bytes = mixer_bytes[mk],
                   .ffn_bytes = ffn_bytes[fk],
                   .input = in.bytes(),
                   .activations = activations});
  }
  return out;
}

nlohmann::json MemoryBreakdown::to_json() const {
  return {{"weights", weights},
          {"grads", grads},
          {"master", master},
          {"optimizer", optimizer},
          {"activations", activations},
          {"fsdp_buffers", fsdp_buffers},
          {"expert_buffers", expert_buffers},
          {"a2a_buffers", a2a_buffers},
          {"workspace", workspace},
          {"total", total()}};
}

namespace {

double fp32(double elems) {
  return static_cast<double>(arena_footprint(static_cast<size_t>(elems) * 4));
}

// The columns a K-concatenation buffer's row of w columns and an r-column adapter block holds
// beyond w + r (ops::grouped_ffn_row_pitch rounds its pitch up to 64; none without an adapter).
double kconcat_row_pad(double w, double r) {
  if (r <= 0) return 0;
  const auto wi = static_cast<int64_t>(w), ri = static_cast<int64_t>(r);
  return static_cast<double>(ops::grouped_ffn_row_pitch(wi, ri) - wi - ri);
}

// Peak scratch (bytes) a block takes from the workspace in forward or backward, following the
// live buffers of each layer's code (kda_layer.cpp, mla_layer.cpp, dsa_layer.cpp, moe_layer.cpp,
// dense_ffn.cpp), activation-dtype tensors scaled by `act` (its size over fp32's). Of the ops' own
// scratch only the KDA core's is counted (fp32: the CPU's C x C chunk buffers per thread, or the
// CUDA chunked kernels' per-chunk products); the rest is small.
double mixer_scratch(const ModelConfig& cfg, MixerKind k, int64_t T, int64_t max_doc, int64_t docs,
                     int threads, Device device, DType act_dtype, double act) {
  if (k == MixerKind::Kda) {
    const double H = static_cast<double>(cfg.kda.heads), K = static_cast<double>(cfg.kda.head_dim);
    const double HK = H * K;
    const ops::KdaParams cp{.tokens = T,
                            .heads = cfg.kda.heads,
                            .head_k = cfg.kda.head_dim,
                            .head_v = cfg.kda.head_dim,
                            .num_seqs = docs,
                            .chunked = cfg.kda.chunked,
                            .chunk = cfg.kda.chunk,
                            .kernels = cfg.kda.kernels};
    double core_fwd = fp32(static_cast<double>(ops::kda_scratch_floats(cp, threads, false)));
    double core_bwd = fp32(static_cast<double>(ops::kda_scratch_floats(cp, threads, true)));
    if (device == Device::CUDA && ops::kda_chunk_kernel_fits(cp)) {
      // Every document's last chunk may be partial: at most T / C + docs chunks.
      const int64_t chunks = (T + cp.chunk - 1) / cp.chunk + docs;
      // Kept prepared products live with the layer's activations (KdaLayer::plan_activations).
      const bool keeps = KdaLayer::keeps_prepared(device, cp);
      core_fwd = fp32(static_cast<double>(
          ops::kda_chunk_workspace_floats(cp, chunks, false, keeps, act_dtype)));
      core_bwd = fp32(
          static_cast<double>(ops::kda_chunk_workspace_floats(cp, chunks, true, keeps, act_dtype)));
    }
    // Forward: the log decay g (fp32 [T, H K]) under the core's scratch. Backward: dog, don, dgb,
    // dga, dcore, dq, dk, dv (activation dtype), dg and dbeta (fp32) live around g, formed again,
    // and the core's own scratch; then the largest of the later groups (two more [T, H K]
    // activations at most).
    const double kept = (fp32(T * HK) * 7 + fp32(T * K)) * act + fp32(T * HK) + fp32(T * H);
    return std::max({fp32(T * HK) + core_fwd, kept + fp32(T * HK) + core_bwd,
                     kept + fp32(T * HK) * 3 * act + fp32(T * H)});
  }
  const MlaConfig& m = k == MixerKind::Dsa ? cfg.dsa.mla : cfg.mla;
  const double H = static_cast<double>(m.heads),
               Dqk = static_cast<double>(m.qk_nope_dim + m.qk_rope_dim);
  const double Dv = static_cast<double>(m.v_head_dim), kvr = static_cast<double>(m.kv_lora_rank);
  const double rope = static_cast<double>(m.qk_rope_dim);
  // Backward: dout, output-gate grads, dq/dk/dv, dkv, dckv, dkpe, dc(n), dcq(n).
  double bwd = fp32(T * H * Dv) * (m.output_gate ? 3 : 1) + fp32(T * H * Dqk) * 2 +
               fp32(T * H * Dv) + fp32(T * H * (m.qk_nope_dim + Dv)) + fp32(T * (kvr + rope)) +
               fp32(T * rope) + fp32(T * kvr) * 2 + fp32(T * H);
  if (m.q_lora_rank > 0) bwd += fp32(T * static_cast<double>(m.q_lora_rank)) * 2;
  double fwd = fp32(T * (kvr + rope)) + fp32(T * rope) + fp32(T * H * (m.qk_nope_dim + Dv));
  if (k == MixerKind::Dsa) {
    const DsaConfig& s = cfg.dsa;
    const double HI = static_cast<double>(s.index_heads),
                 DI = static_cast<double>(s.index_head_dim);
    const double slots = static_cast<double>(s.dense_warmup ? max_doc : s.index_topk);
    // The composite selection's [T, longest document] candidate (i32) and score (f32) tables,
    // fp32-sized under every policy. The GPU's fused kernel (bf16 within indexer_topk_fits,
    // ops/cuda/dsa_indexer_topk.cu) keeps neither: counting them there planned 64 GiB of
    // workspace that a T = 131072 step never takes.
    const bool fused_selection = device == Device::CUDA && act < 1 &&
                                 ops::indexer_topk_fits(s.index_heads, s.index_head_dim);
    if (!s.dense_warmup && !fused_selection)
      fwd = std::max(fwd, 2 * fp32(T * static_cast<double>(max_doc)) / act);
    // The KL's target, softmax and scores (fp32: counted twice); the GPU's fused KL (bf16 within
    // indexer_scores_kl_fits, ops/cuda/indexer_tc.cu) keeps only the target.
    const bool fused_kl =
        device == Device::CUDA && act < 1 &&
        ops::indexer_scores_kl_fits(s.index_heads, s.index_head_dim, static_cast<int64_t>(slots));
    const double kl_tables = fp32(T * slots) * (fused_kl ? 2 : 6);
    fwd = std::max(fwd, kl_tables);
    // After MLA backward has released its scratch: dscores, dqi, dkn, dw, dki. On the GPU the
    // key gradient's transposed index table (two i32 buffers a slot) and, on the tensor-core path
    // (ops/cuda/indexer_tc.cu), the heads' q . k > 0 bits (u16 a slot and 16-head group) take
    // their sizes whatever the activation dtype.
    double index_bwd = fp32(T * slots) + fp32(T * HI * DI) + fp32(T * DI) * 2 + fp32(T * HI);
    if (device == Device::CUDA) {
      const bool tc =
          act < 1 && s.index_heads <= 64 && (s.index_head_dim == 64 || s.index_head_dim == 128);
      const double groups = std::ceil(HI / 16);
      index_bwd += (fp32(T * slots) * 2 + (tc ? fp32(T * slots * groups / 2) : 0)) / act;
    }
    // A training step forms the KL in backward (DsaLayer::backward after a forward told that
    // backward follows): the same tables once MLA backward has returned.
    bwd = std::max({bwd, index_bwd, kl_tables});
    // The absorbed sparse stage (MlaLayer::absorbs): dout, gate grads, dq, dcn, dckv, dkpe, then
    // dol, dqa, dkvl and the CUDA kernel's fp32 key-gradient sum (counted twice: it stays fp32)
    // in place of dk, dv and dkv, and qa rebuilt; in a training step also the KL target the
    // attention backward writes (fp32: twice). A LoRA adapter on kv_b_proj adds W_eff,
    // dW_eff and fp32 copies of A and B (MlaLayer::absorb_weight, lora_grads_from). Forward
    // holds qa in the workspace through the KL's fp32 tables (twice: they stay fp32).
    if (!s.dense_warmup && m.qk_nope_dim > 0 && max_doc > s.index_topk) {
      double abs_bwd = fp32(T * H * Dv) * (m.output_gate ? 3 : 1) + fp32(T * H * Dqk) +
                       fp32(T * kvr) * 2 + fp32(T * (kvr + rope)) * 4 + fp32(T * rope) +
                       fp32(T * H * kvr) + fp32(T * H * (kvr + rope)) * 2 + fp32(T * slots) * 2;
      double abs_fwd = fp32(T * H * (kvr + rope)) + kl_tables;
      if (m.lora.rank > 0) {
        const double out = H * (static_cast<double>(m.qk_nope_dim) + Dv),
                     r = static_cast<double>(m.lora.rank);
        abs_bwd += fp32(out * kvr) * 2 + fp32(out * r) + fp32(r * kvr);
        abs_fwd += fp32(out * kvr);
      }
      fwd = std::max(fwd, abs_fwd);
      if (m.q_lora_rank > 0) abs_bwd += fp32(T * static_cast<double>(m.q_lora_rank)) * 2;
      bwd = std::max(bwd, abs_bwd);
    }
  }
  return std::max(fwd, bwd) * act;
}

// Bytes, with `act` the activation dtype's size over fp32's: tensors in the activation dtype are
// scaled by it, the ones that stay fp32 under every policy (gate weights and their gradient, the
// router's logits gradient) are not.
double ffn_scratch(const ModelConfig& cfg, FfnKind k, int64_t T, Device device, double act) {
  if (k == FfnKind::Dense) return fp32(T * static_cast<double>(cfg.dense.ffn)) * 3 * act;
  const MoeConfig& m = cfg.moe;
  const double N = static_cast<double>(T * m.top_k), l = static_cast<double>(m.latent);
  const double F = static_cast<double>(m.expert_ffn), E = static_cast<double>(m.num_experts);
  const double r = static_cast<double>(m.expert_lora.rank);
  const double S = static_cast<double>(m.num_shared * m.shared_ffn);
  const bool latent = m.latent != m.hidden;
  // drows_out carries the K-concatenation path's spare columns (ops/grouped_ffn.h,
  // grouped_ffn_row_pitch) where the path may run: bf16 on the GPU (an upper bound elsewhere).
  const double pad = device == Device::CUDA && act < 1.0 ? r + kconcat_row_pad(l, r) : 0.0;
  double held = ((m.num_shared > 0 ? fp32(T * S) * 3 : 0) + (latent ? fp32(T * l) : 0) +
                 fp32(N * l) * 2 + fp32(N * pad)) *
                    act +
                fp32(T * static_cast<double>(m.top_k));  // dweights: fp32
  // grouped_ffn_backward (h without LoRA, dh, dgu, dr; with LoRA the composite SwiGLU backward's
  // adapted gate_up and dh, ops/grouped_ffn_lora.h), later dx_lat + router (dlogits and its own
  // scratch).
  // The side slices of a K + r GEMM, where the K-concatenation path runs: a [16, 64] bf16 slice
  // per expert and 64-wide k-tile (ops/cuda/cutlass/grouped_gemm_sm90.h).
  const auto side_bytes = [&](double width) {
    return pad > 0 ? E * std::ceil(width / 64) * 16 * 64 * 2 : 0.0;
  };
  // A dX GEMM that forms dr in its mainloop lays (s B)^T out beside it (for the k-tiles of out +
  // r: l + r for the down one, 2F + r for the gate/up one; one at a time).
  const double side_dx = side_bytes(std::max(l, 2 * F) + r);
  const double grouped =
      (fp32(N * F) * (r > 0 ? 6 : 4) + (r > 0 ? fp32(N * r) : 0)) * act + side_dx;
  const double router = (latent ? fp32(T * l) * act : 0) + fp32(T * E) * 3;
  // Forward: router selection scratch, and where the K-concatenation path runs, A_gu laid out for
  // the gate/up GEMM that forms xa in its mainloop (the side slices of l + r).
  const double side = side_bytes(l + r);
  const double fwd = fp32(T * E) * 2 + fp32(T * static_cast<double>(m.n_group)) * 2 + side;
  // On the GPU each expert GEMM call takes its own small scratch on top (per-group addresses,
  // CUTLASS's).
  const double gemm =
      device == Device::CUDA ? static_cast<double>(ops::kGroupedMatmulScratchBytes) : 0.0;
  return std::max(fwd, held + std::max(grouped, router)) + gemm;
}

// The K-concatenation path's pads around the routed experts' base weights (ops/grouped_ffn.h:
// each projection's frozen W [E, out, in] lives in [E, out + r, in + r], rows
// grouped_ffn_row_pitch(in, r) apart), where a GPU runs it: experts computed where they live (no
// expert parallelism), bf16. E ((out + r) pitch - out in) elements per projection and MoE layer,
// with pitch - in < r + 64: a term in E x (r + 64) x (d + ffn), never in E x d x ffn.
double kconcat_pad_bytes(const ModelConfig& cfg, const ParallelPlan& p, const MemoryOptions& o) {
  const MoeConfig& m = cfg.moe;
  const ops::GroupedFfnParams gp{.rows = 1,
                                 .experts = m.num_experts,
                                 .in = m.latent,
                                 .ffn = m.expert_ffn,
                                 .lora_rank = m.expert_lora.rank};
  if (!o.freeze_base || p.ep != 1 || !ops::grouped_ffn_kconcat(gp, o.device, o.precision.weights))
    return 0;
  double layers = 0;
  for (const LayerIR& layer : cfg.layers) layers += layer.ffn == FfnKind::Moe;
  const int64_t r = m.expert_lora.rank, l = m.latent, F = m.expert_ffn;
  const auto pads = [r](int64_t out, int64_t in) {
    return static_cast<double>((out + r) * ops::grouped_ffn_row_pitch(in, r) - out * in);
  };
  return layers * static_cast<double>(m.num_experts) * (pads(2 * F, l) + pads(l, F)) *
         static_cast<double>(dtype_size(o.precision.weights));
}

}  // namespace

MemoryBreakdown predict_memory(const ModelConfig& cfg, const ParallelPlan& p,
                               const MemoryOptions& o) {
  return predict_memory(cfg, count_params(cfg, o.freeze_base, o.precision),
                        block_activations(cfg, p.mbs, p.seq, o.precision.activations, o.device), p,
                        o);
}

MemoryBreakdown predict_memory(const ModelConfig& cfg, const ParamCounts& c,
                               const std::vector<BlockActs>& acts, const ParallelPlan& p,
                               const MemoryOptions& o) {
  MT_CHECK(p.fsdp >= 1 && p.ep >= 1 && p.expert_shard >= 1, ValueError,
           "plan sizes must be positive");
  MT_CHECK(c.precision == o.precision, ValueError, "parameter counts are for precision ",
           precision_name(c.precision), ", the memory options say ", precision_name(o.precision));
  for (const BlockActs& b : acts)
    MT_CHECK(b.activations == o.precision.activations, ValueError,
             "block activations are planned as ", dtype_name(b.activations),
             ", the memory options say ", dtype_name(o.precision.activations));
  const BytesPerElement dt = bytes_per_element(o.precision);
  const double dense_tr = static_cast<double>(c.trainable - c.expert_trainable);
  // Masters exist only for trainable parameters stored narrower than fp32 (dense ones here).
  const double dense_master = dense_tr - static_cast<double>(c.trainable_fp32);
  const double E = static_cast<double>(std::max<int64_t>(cfg.moe.num_experts, 1));
  // Whole experts per rank, then sharded across replicas.
  const double expert_share =
      std::ceil(E / static_cast<double>(p.ep)) / E / static_cast<double>(p.expert_shard);
  const double fsdp = static_cast<double>(p.fsdp);
  const double ex_tr = static_cast<double>(c.expert_trainable) * expert_share;
  // Stored value bytes: each parameter in its own dtype (buffers stay fp32).
  const double dense_b = static_cast<double>(c.weight_bytes - c.expert_bytes);
  const double ex_b = static_cast<double>(c.expert_bytes) * expert_share;

  MemoryBreakdown m;
  if (p.engine == Engine::Zero1Ep) {
    // Full dense weights and gradients on every rank; AdamW state for the rank's shard only
    // (dense over the world, local experts over the replicas that shard them).
    const double ex_local_tr =
        static_cast<double>(c.expert_trainable) * expert_share * p.expert_shard;
    const double world = static_cast<double>(p.world);
    m.weights = dense_b + ex_b * p.expert_shard;
    m.grads = (dense_tr + ex_local_tr) * dt.grad;
    m.master = (dense_master / world + ex_tr) * dt.master;
    m.optimizer = (dense_tr / world + ex_tr) * dt.optim;
  } else if (p.engine == Engine::FsdpEp) {
    // Dense values and gradients as flat shards over the world (buffers stay whole). Experts:
    // with expert_shard > 1 ZeRO-3 over the replicas (parallel.shard_expert_weights: values,
    // gradients and state as shards), else whole local experts as under zero1+ep. Each unit's
    // flat groups are padded to a multiple of the group: < group size elements each, left out.
    const double world = static_cast<double>(p.world);
    const double buffers = static_cast<double>(c.buffer_bytes);
    m.weights = (dense_b - buffers) / world + buffers + ex_b;
    m.grads = (dense_tr / world + ex_tr) * dt.grad;
    m.master = (dense_master / world + ex_tr) * dt.master;
    m.optimizer = (dense_tr / world + ex_tr) * dt.optim;
  } else {
    m.weights = dense_b / fsdp + ex_b + kconcat_pad_bytes(cfg, p, o);
    m.grads = (dense_tr / fsdp + ex_tr) * dt.grad;
    m.master = (dense_master / fsdp + ex_tr) * dt.master;
    m.optimizer = (dense_tr / fsdp + ex_tr) * dt.optim;
  }

  // Activations: what each block keeps, plus the one block being recomputed in backward.
  const int64_t T = p.tokens(), d = cfg.hidden;
  // Embedding output, final norm and the head's input gradient (activations), final rstd and lse
  // (fp32).
  const double act_bytes = static_cast<double>(
      arena_footprint(static_cast<size_t>(T * d) * dtype_size(o.precision.activations)));
  double a = act_bytes * 3 + fp32(static_cast<double>(T)) * 2;
  size_t recomputed = 0;
  for (const BlockActs& b : acts) {
    a += static_cast<double>(b.saved(p.recompute));
    // Selective replays one FFN into scratch: its saved tensors plus its (discarded) output.
    if (p.recompute == Recompute::Selective)
      recomputed = std::max(recomputed, b.ffn_bytes + b.input);
    if (p.recompute == Recompute::Full) recomputed = std::max(recomputed, b.all());
  }
  a += static_cast<double>(recomputed);
  m.activations = a;

  // Workspace: residual gradients (3 x [T, d]) + the largest of cross-entropy and block scratch.
  // Cross-entropy's backward holds a chunk's fp32 logits and their gradient (activation dtype).
  const double act = dt.act / 4.0;
  const int64_t ce_rows = std::min(o.ce_chunk > 0 ? o.ce_chunk : ops::ce_chunk_tokens(o.device), T);
  double ws = fp32(static_cast<double>(ce_rows * cfg.vocab)) * (1 + act);
  for (const LayerIR& l : cfg.layers) {
    ws = std::max(ws, mixer_scratch(cfg, l.mixer, T, p.seq, p.mbs, o.threads, o.device,
                                    o.precision.activations, act));
    ws = std::max(ws, ffn_scratch(cfg, l.ffn, T, o.device, act));
  }
  m.workspace = fp32(static_cast<double>(T * d)) * 3 * act + ws;

  if (p.engine != Engine::Fsdp) {
    // The optimizer step posts every unit's reduction at once: a flat copy of all trainable
    // gradients, the reduced shards, and one unit's flat parameters (the largest) being updated.
    const double ex_local_tr =
        static_cast<double>(c.expert_trainable) * expert_share * p.expert_shard;
    const double world = static_cast<double>(p.world);
    m.fsdp_buffers =
        (dense_tr + ex_local_tr + dense_tr / world + ex_tr) * dt.grad +
        static_cast<double>(std::max(c.largest_unit_trainable, c.expert_layer_trainable)) *
            dt.weight;
    if (p.engine == Engine::FsdpEp) {
      // Dense gradients already live in the FSDP shards: the step packs only whole experts, all
      // of them one optimizer unit (its flat gradient and the flat parameters of the same unit).
      // Fsdp plans its buffers once, double-buffered for the largest unit: two gathered units
      // (current + prefetch), two unit gradients (the bound one and the one being reduced) and
      // their two reduce-scatter shards. With ZeRO-3 experts each unit's layer experts get the
      // same, reduced over the replicas (2 + 2 / R full expert gradients).
      const double R = static_cast<double>(p.expert_shard);
      const double step = p.expert_shard > 1 ? 0 : 2 * ex_local_tr * dt.grad;
      double units = 2 * static_cast<double>(c.largest_unit_bytes) +
                     static_cast<double>(c.largest_unit_trainable) * (2 + 2 / world) * dt.grad;
      if (p.expert_shard > 1) {
        const double local = expert_share * R;  // the rank's whole experts of one layer
        units += 2 * static_cast<double>(c.expert_layer_bytes) * local +
                 static_cast<double>(c.expert_layer_trainable) * local * (2 + 2 / R) * dt.grad;
      }
      m.fsdp_buffers = std::max(step, units);
    }
    if (p.ep > 1 && cfg.moe.num_experts > 0) {
      // ExpertParallel: received rows, returned rows and the chunk's input and output while
      // exchanging, plus the sorted input and grouped-FFN saved tensors of every MoE layer kept
      // for backward (outside the model's activation arena; [h | ha] at the K-concatenation
      // path's pitch where it may run, bf16 on the GPU).
      const double rows = static_cast<double>(T * cfg.moe.top_k) * o.a2a_capacity;
      const double l = static_cast<double>(cfg.moe.latent);
      const double F = static_cast<double>(cfg.moe.expert_ffn);
      const double r = static_cast<double>(cfg.moe.expert_lora.rank);
      const double pad = o.device == Device::CUDA && dt.act < 4.0 ? kconcat_row_pad(F, r) : 0.0;
      int64_t moe = 0;
      for (const LayerIR& layer : cfg.layers) moe += layer.ffn == FfnKind::Moe;
      m.a2a_buffers =
          (fp32(rows * l) * 4 +
           static_cast<double>(moe) * fp32(rows * (l + 2 * F + 2 * r + (r > 0 ? F : 0) + pad))) *
          dt.act / 4.0;
    }
    return m;
  }
  // FSDP gathers one unit at a time: the one in use and the prefetched next, plus the unit's
  // unsharded gradient before its reduce-scatter.
  if (p.fsdp > 1)
    m.fsdp_buffers = 2 * static_cast<double>(c.largest_unit_bytes) +
                     static_cast<double>(c.largest_unit_trainable) * dt.grad;
  if (p.expert_shard > 1) {
    // The rank's experts of one layer, gathered whole from the replicas that shard them.
    const double es = static_cast<double>(p.expert_shard);
    m.expert_buffers = 2 * static_cast<double>(c.expert_layer_bytes) * expert_share * es +
                       static_cast<double>(c.expert_layer_trainable) * expert_share * es * dt.grad;
  }
  if (p.ep > 1 && cfg.moe.num_experts > 0) {
    const double rows = static_cast<double>(T * cfg.moe.top_k) * o.a2a_capacity;
    const double one = rows * static_cast<double>(cfg.moe.latent) * dt.act;
    // Send + receive; with chunks, two chunks in flight (double buffering).
    m.a2a_buffers = p.a2a_chunks > 1 ? 4 * one / static_cast<double>(p.a2a_chunks) : 2 * one;
  }
  return m;
}

Flops& Flops::operator+=(const Flops& o) {
  dense_gemm += o.dense_gemm;
  expert_gemm += o.expert_gemm;
  kda_core += o.kda_core;
  attn_dense += o.attn_dense;
  attn_sparse += o.attn_sparse;
  indexer += o.indexer;
  return *this;
}

Flops Flops::scaled(double s) const {
  return {dense_gemm * s, expert_gemm * s, kda_core * s,
          attn_dense * s, attn_sparse * s, indexer * s};
}

nlohmann::json Flops::to_json() const {
  return {{"dense_gemm", dense_gemm}, {"expert_gemm", expert_gemm}, {"kda_core", kda_core},
          {"attn_dense", attn_dense}, {"attn_sparse", attn_sparse}, {"indexer", indexer},
          {"total", total()}};
}

namespace {

// Mean over positions 0..s-1 of min(k, pos + 1): keys a query attends to under top-k.
double mean_keys(double s, double k) {
  if (s <= k) return (s + 1) / 2;
  return (k * (k + 1) / 2 + (s - k) * k) / s;
}

}  // namespace

StepFlops flops_per_token(const ModelConfig& cfg, int64_t seq, bool freeze_base, Recompute r) {
  StepFlops out;
  const double s = static_cast<double>(seq);
  const double E = static_cast<double>(std::max<int64_t>(cfg.moe.num_experts, 1));
  const double K = static_cast<double>(cfg.moe.top_k);
  std::vector<Flops> mixer_fwd(cfg.layers.size()), ffn_fwd(cfg.layers.size());
  // Matrix products from the specs: every weight of rank >= 2 is applied once per token (2 FLOPs
  // per multiply-add; the depthwise convolutions too); routed experts ([E, out, in] and their
  // adapters) top_k times out of E.
  for (const NamedSpec& ns : model_param_specs(cfg)) {
    const ParamSpec& sp = ns.spec;
    if (ns.name == "model.embed_tokens.weight" || sp.role == ParamRole::Buffer) continue;
    const int rank = sp.shape.ndim();
    if (rank < 2) continue;
    const double n = static_cast<double>(sp.shape.numel());
    const bool expert = is_expert(ns);
    const double fwd = expert ? 2 * n / E * K : 2 * n;
    const bool tr = is_trainable(sp, freeze_base);
    // The indexer's inputs are detached: its projections get a weight gradient, never dgrad.
    const bool indexer = ns.name.find(".indexer.") != std::string::npos;
    const double passes = indexer ? (tr ? 2 : 1) : (tr ? 3 : 2);
    Flops f;
    (expert ? f.expert_gemm : f.dense_gemm) = fwd;
    out.forward += f;
    out.train += f.scaled(passes);
    if (ns.name.rfind("model.layers.", 0) == 0) {
      const size_t li = std::stoul(ns.name.substr(13, ns.name.find('.', 13) - 13));
      const bool mix = ns.name.find(".self_attn.") != std::string::npos;
      (mix ? mixer_fwd : ffn_fwd)[li] += f;
    }
  }
  if (cfg.tie_embeddings) {
    Flops f;
    f.dense_gemm = 2.0 * static_cast<double>(cfg.vocab * cfg.hidden);
    out.forward += f;
    out.train += f.scaled(freeze_base ? 2 : 3);
  }
  // Cores (no weights): forward, and backward at twice the forward.
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    Flops fwd, train;
    switch (cfg.layers[i].mixer) {
      case MixerKind::Kda: {
        const double H = static_cast<double>(cfg.kda.heads);
        const double D = static_cast<double>(cfg.kda.head_dim);
        const double C = std::min(static_cast<double>(cfg.kda.chunk), s);
        // Per head and token, chunked form: q.k^T and k.k^T over the causal half of the chunk
        // (2CD), the UT transform applied to k and v (2CD), the intra-chunk output (CD), and
        // three D x D products with the state (q.S, w.S, k^T u: 6D^2).
        fwd.kda_core = H * (5 * C * D + 6 * D * D);
        train = fwd.scaled(3);
        break;
      }
      case MixerKind::Mla:
      case MixerKind::Dsa: {
        const bool dsa = cfg.layers[i].mixer == MixerKind::Dsa;
        const MlaConfig& m = dsa ? cfg.dsa.mla : cfg.mla;
        const double H = static_cast<double>(m.heads);
        const double dqk = static_cast<double>(m.qk_nope_dim + m.qk_rope_dim);
        const double dv = static_cast<double>(m.v_head_dim);
        if (!dsa || cfg.dsa.dense_warmup) {
          fwd.attn_dense = 2 * H * (dqk + dv) * (s + 1) / 2;
          train.attn_dense = 3 * fwd.attn_dense;
        } else {
          const double k = mean_keys(s, static_cast<double>(cfg.dsa.index_topk));
          fwd.attn_sparse = 2 * H * (dqk + dv) * k;
          train.attn_sparse = 3 * fwd.attn_sparse;
        }
        if (dsa) {
          const double hd = static_cast<double>(cfg.dsa.index_heads * cfg.dsa.index_head_dim);
          const double slots = cfg.dsa.dense_warmup
                                   ? (s + 1) / 2
                                   : mean_keys(s, static_cast<double>(cfg.dsa.index_topk));
          // Selection scores every previous position; the KL loss rescores the selected slots
          // and backpropagates through them.
          fwd.indexer = 2 * hd * (s + 1) / 2 + 2 * hd * slots;
          train.indexer = fwd.indexer + 2 * (2 * hd * slots);
        }
        break;
      }
    }
    out.forward += fwd;
    out.train += train;
    mixer_fwd[i] += fwd;
  }
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    if (r == Recompute::Selective) out.recompute += ffn_fwd[i];
    if (r == Recompute::Full) {
      out.recompute += mixer_fwd[i];
      out.recompute += ffn_fwd[i];
    }
  }
  return out;
}

}  // namespace mt::plan
