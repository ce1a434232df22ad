#include "io/hf_config.h"

#include "model/json_keys.h"
#include "model/vision/vision_config.h"
#include "ops/moe_rules.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <type_traits>

namespace mt {
namespace {

using nlohmann::json;

// Keys PreTrainedConfig writes for every model, and the ones text models add; none changes
// training math.
void ignore_generic(JsonKeys& k) {
  k.ignore_pretrained_config();
  k.ignore({"auto_map", "bos_token_id", "eos_token_id", "ep_size", "model_max_length",
            "max_position_embeddings", "tokenizer_class",
            // Validated by hf_config_from_json; FP8 weights are dequantised on load.
            "quantization_config"});
  k.only("attention_dropout", 0.0);
  k.only("hidden_act", std::string("silu"));
  k.only("attention_bias", false);
  k.only("mlp_bias", false);
  k.only("pretraining_tp", int64_t{1});
}

// The keys every text model reads alike: model type, sizes, norm eps (its default per family),
// tied embeddings, pad id. Returns num_hidden_layers.
int64_t text_model_keys(JsonKeys& k, HfConfig& h, const std::string& source, const char* model_type,
                        float eps_default) {
  ModelConfig& c = h.model;
  c.model_type = model_type;
  ignore_generic(k);
  k.ignore({"model_type"});
  c.vocab = k.need<int64_t>({"vocab_size"});
  c.hidden = k.need<int64_t>({"hidden_size"});
  const int64_t n = k.need<int64_t>({"num_hidden_layers"});
  require_positive(c.vocab, source, "vocab_size");
  require_positive(c.hidden, source, "hidden_size");
  require_positive(n, source, "num_hidden_layers");
  c.norm_eps = k.get<float>({"rms_norm_eps"}, eps_default);
  c.tie_embeddings = k.get<bool>({"tie_word_embeddings"}, false);
  h.pad_token_id = k.get<int64_t>({"pad_token_id"}, -1);
  return n;
}

// Layer FFN kinds: mlp_layer_types ("dense"/"sparse") wins, else first_k_dense_replace.
void ffn_kinds(JsonKeys& k, ModelConfig& c, int64_t n_layers, int64_t first_dense_default) {
  const json* mlp = k.raw("mlp_layer_types");
  int64_t first_dense = k.get<int64_t>({"first_k_dense_replace"}, first_dense_default);
  k.only("moe_layer_freq", int64_t{1});
  for (int64_t i = 0; i < n_layers; ++i) {
    if (mlp) {
      MT_CHECK(mlp->is_array() && static_cast<int64_t>(mlp->size()) == n_layers, ConfigError,
               k.where(), ": mlp_layer_types must list ", n_layers, " entries");
      const json& e = (*mlp)[static_cast<size_t>(i)];
      MT_CHECK(e == "dense" || e == "sparse", ConfigError, k.where(), ": mlp_layer_types[", i,
               "] = ", e.dump(), " (expected dense or sparse)");
      c.layers[static_cast<size_t>(i)].ffn = e == "dense" ? FfnKind::Dense : FfnKind::Moe;
    } else {
      c.layers[static_cast<size_t>(i)].ffn = i < first_dense ? FfnKind::Dense : FfnKind::Moe;
    }
  }
}

// The DeepSeek-V3 MoE block as transformers implements it: sigmoid scores, the
// e_score_correction_bias buffer for selection, group-limited top-k, no latent projection.
void deepseek_moe(JsonKeys& k, ModelConfig& c) {
  c.moe.hidden = c.hidden;
  c.moe.latent = c.hidden;
  c.moe.num_experts = k.get<int64_t>({"n_routed_experts", "num_experts", "num_local_experts"}, 0);
  c.moe.top_k = k.get<int64_t>({"num_experts_per_tok", "num_experts_per_token"}, 0);
  c.moe.expert_ffn = k.get<int64_t>({"moe_intermediate_size"}, 0);
  c.moe.num_shared = k.get<int64_t>({"n_shared_experts", "num_shared_experts"}, 0);
  c.moe.shared_ffn = c.moe.expert_ffn;
  c.moe.score = RouterScore::Sigmoid;
  k.only("scoring_func", std::string("sigmoid"));
  k.only("moe_router_activation_func", std::string("sigmoid"));
  k.only("topk_method", std::string("noaux_tc"));
  k.only("use_grouped_topk", true);
  c.moe.n_group = k.get<int64_t>({"n_group", "num_expert_group"}, 1);
  c.moe.topk_group = k.get<int64_t>({"topk_group"}, 1);
  c.moe.norm_topk_prob = k.get<bool>({"norm_topk_prob", "moe_renormalize"}, true);
  c.moe.routed_scaling = k.get<float>({"routed_scaling_factor"}, 1.0f);
  c.moe.selection_bias = true;
  // DeepSeek's own training used a sequence-wise balance loss with this weight; transformers
  // implements none, so matching it means accepting the keys without effect.
  k.ignore({"aux_loss_alpha", "seq_aux"});
  // transformers trains with the plain LM loss: no auxiliary router losses, no bias updates.
  c.moe.bias_update_rate = 0.f;
  c.moe.seq_aux_coeff = 0.f;
  c.moe.z_loss_coeff = 0.f;
  bool any_moe = false;
  for (const LayerIR& l : c.layers) any_moe |= l.ffn == FfnKind::Moe;
  if (!any_moe) return;
  require_positive(c.moe.num_experts, k.where(), "n_routed_experts");
  require_positive(c.moe.top_k, k.where(), "num_experts_per_tok");
  require_positive(c.moe.expert_ffn, k.where(), "moe_intermediate_size");
  MT_CHECK(c.moe.num_shared >= 0, ConfigError, k.where(), ": n_shared_experts is negative");
  const std::string routing =
      ops::routing_error(c.moe.num_experts, c.moe.top_k, c.moe.n_group, c.moe.topk_group);
  MT_CHECK(routing.empty(), ConfigError, k.where(), ": ", routing);
  MT_CHECK(c.moe.num_experts / c.moe.n_group >= 2 || c.moe.n_group == 1, ConfigError, k.where(),
           ": group-limited routing sums the top-2 scores of a group; groups need 2 experts");
}

// transformers 5.24 writes output_router_logits for MoE models. Off, it only decides what the
// forward returns; on, transformers adds router_aux_loss_coef times its load-balancing loss to
// the LM loss, which the engine does not reproduce.
void router_output_keys(JsonKeys& k) {
  k.only("output_router_logits", false);
  k.ignore({"router_aux_loss_coef"});
}

void mla_common(JsonKeys& k, ModelConfig& c) {
  c.mla.hidden = c.hidden;
  c.mla.heads = k.need<int64_t>({"num_attention_heads"});
  int64_t kv_heads = k.get<int64_t>({"num_key_value_heads"}, c.mla.heads);
  MT_CHECK(kv_heads == c.mla.heads, ConfigError, k.where(), ": num_key_value_heads ", kv_heads,
           " != num_attention_heads ", c.mla.heads, " is not supported");
  c.mla.q_lora_rank = k.get<int64_t>({"q_lora_rank"}, 0);
  c.mla.kv_lora_rank = k.need<int64_t>({"kv_lora_rank"});
  c.mla.qk_nope_dim = k.need<int64_t>({"qk_nope_head_dim"});
  c.mla.qk_rope_dim = k.need<int64_t>({"qk_rope_head_dim"});
  c.mla.v_head_dim = k.need<int64_t>({"v_head_dim"});
  k.ignore({"head_dim"});  // derived (= qk_rope_head_dim) by transformers
  int64_t qk = c.mla.qk_nope_dim + c.mla.qk_rope_dim;
  k.only("qk_head_dim", qk);  // derived too; any other value would contradict the two dims
  c.mla.norm_eps = 1e-6f;     // q_a_layernorm / kv_a_layernorm use RMSNorm's default eps
  c.mla.output_gate = false;
  require_positive(c.mla.heads, k.where(), "num_attention_heads");
  require_positive(c.mla.kv_lora_rank, k.where(), "kv_lora_rank");
  require_positive(c.mla.v_head_dim, k.where(), "v_head_dim");
  require_positive(c.mla.qk_nope_dim + c.mla.qk_rope_dim, k.where(),
                   "qk_nope_head_dim+qk_rope_head_dim");
  MT_CHECK(c.mla.qk_rope_dim % 2 == 0, ConfigError, k.where(), ": qk_rope_head_dim must be even");
}

// YaRN's magnitude correction 0.1 * m * ln(s) + 1 (1 when not extending).
double yarn_mscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1;
}

// rope_scaling (checkpoints; wins, as in transformers) or rope_parameters (transformers v5), with
// a top-level rope_theta as the fallback base. "yarn" sets the frequency correction, the cos/sin
// magnitude (attention_factor) and, through mscale_all_dim, the attention softmax scale, exactly
// as transformers' DeepSeek attention does; other rope types are refused by name.
void rope_settings(JsonKeys& k, MlaConfig& m, int64_t default_max_positions) {
  float theta = k.get<float>({"rope_theta"}, 10000.f);
  const json* rs = k.raw("rope_scaling");
  const json* rp = k.raw("rope_parameters");
  const char* key = rs ? "rope_scaling" : "rope_parameters";
  const json* p = rs ? rs : rp;
  m.rope_theta = theta;
  m.rope_scaling = {};
  m.softmax_scale = 0;
  if (!p || (p->is_object() && p->empty())) return;
  JsonKeys r(*p, k.where() + "." + key);
  m.rope_theta = r.get<float>({"rope_theta"}, theta);
  const std::string type = r.get<std::string>({"rope_type", "type"}, "default");
  if (type == "default") {
    r.reject_unknown();
    return;
  }
  MT_CHECK(type == "yarn", ConfigError, r.where(), ": rope_type '", type,
           "' is not supported (default and yarn are)");
  ops::RopeScaling& y = m.rope_scaling;
  const int64_t max_pos = k.get<int64_t>({"max_position_embeddings"}, default_max_positions);
  y.original_max_positions = r.get<int64_t>({"original_max_position_embeddings"}, max_pos);
  require_positive(y.original_max_positions, r.where(), "original_max_position_embeddings");
  // transformers derives a missing factor from the two context lengths.
  const double factor = r.get<double>(
      {"factor"}, static_cast<double>(max_pos) / static_cast<double>(y.original_max_positions));
  MT_CHECK(factor >= 1.0, ConfigError, r.where(), ": 'factor' must be >= 1, got ", factor);
  y.factor = static_cast<float>(factor);
  // transformers treats 0 like absent for these ("or" defaults).
  const double beta_fast = r.get<double>({"beta_fast"}, 0.0),
               beta_slow = r.get<double>({"beta_slow"}, 0.0);
  y.beta_fast = static_cast<float>(beta_fast != 0 ? beta_fast : 32.0);
  y.beta_slow = static_cast<float>(beta_slow != 0 ? beta_slow : 1.0);
  MT_CHECK(y.beta_fast > 0 && y.beta_slow > 0, ConfigError, r.where(),
           ": beta_fast and beta_slow must be positive");
  y.truncate = r.get<bool>({"truncate"}, true);
  const double mscale = r.get<double>({"mscale"}, 0.0);
  const double mscale_all = r.get<double>({"mscale_all_dim"}, 0.0);
  double attn_factor;
  if (r.has({"attention_factor"})) {
    attn_factor = r.get<double>({"attention_factor"}, 1.0);
    MT_CHECK(attn_factor > 0, ConfigError, r.where(), ": 'attention_factor' must be positive");
  } else if (mscale != 0 && mscale_all != 0) {
    attn_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all);
  } else {
    attn_factor = yarn_mscale(factor, 1.0);
  }
  y.magnitude = static_cast<float>(attn_factor);
  if (mscale_all != 0) {
    const double ms = yarn_mscale(factor, mscale_all);
    const double qk = static_cast<double>(m.qk_nope_dim + m.qk_rope_dim);
    m.softmax_scale = static_cast<float>(ms * ms / std::sqrt(qk));
  }
  r.reject_unknown();
}

// The dense FFN (intermediate_size, required where a layer is dense), the layers' FFN kinds
// (first_k_dense_replace's default per family) and the DeepSeek MoE keys.
void deepseek_ffn(JsonKeys& k, ModelConfig& c, int64_t n, int64_t first_dense_default,
                  const std::string& source) {
  c.dense.hidden = c.hidden;
  c.dense.ffn = k.get<int64_t>({"intermediate_size"}, 0);
  ffn_kinds(k, c, n, first_dense_default);
  for (const LayerIR& l : c.layers)
    if (l.ffn == FfnKind::Dense) require_positive(c.dense.ffn, source, "intermediate_size");
  deepseek_moe(k, c);
}

HfConfig kimi_linear(const json& j, const std::string& source) {
  JsonKeys k(j, source);
  HfConfig h;
  ModelConfig& c = h.model;
  const int64_t n = text_model_keys(k, h, source, "kimi_linear", 1e-5f);
  c.layers.assign(static_cast<size_t>(n), LayerIR{});

  // Layer kinds: layer_types wins; else linear_attn_config's 1-based lists; else every 4th.
  const json* lac = k.raw("linear_attn_config");
  json lac_obj = lac ? *lac : json::object();
  JsonKeys la(lac_obj, source + ".linear_attn_config");
  c.kda.hidden = c.hidden;
  c.kda.heads = la.get<int64_t>({"num_heads"}, k.get<int64_t>({"linear_num_heads"}, 32));
  c.kda.head_dim = la.get<int64_t>({"head_dim"}, k.get<int64_t>({"linear_head_dim"}, 128));
  c.kda.conv_kernel =
      la.get<int64_t>({"short_conv_kernel_size"}, k.get<int64_t>({"linear_conv_kernel_dim"}, 4));
  c.kda.norm_eps = c.norm_eps;
  std::vector<std::string> kinds(static_cast<size_t>(n));
  if (const json* lt = k.raw("layer_types")) {
    kinds = k.get<std::vector<std::string>>({"layer_types"}, {});
    MT_CHECK(static_cast<int64_t>(kinds.size()) == n, ConfigError, source, ": layer_types has ",
             kinds.size(), " entries for ", n, " layers");
    (void)lt;
    la.ignore({"kda_layers", "full_attn_layers"});
  } else if (la.has({"kda_layers"}) && la.has({"full_attn_layers"})) {
    for (const char* key : {"full_attn_layers", "kda_layers"}) {
      for (int64_t one_based : la.need<std::vector<int64_t>>({key})) {
        MT_CHECK(one_based >= 1 && one_based <= n, ConfigError, la.where(), ": ", key, " entry ",
                 one_based, " outside [1, ", n, "] (the lists are 1-based)");
        kinds[static_cast<size_t>(one_based - 1)] =
            std::string(key) == "kda_layers" ? "linear_attention" : "full_attention";
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i)
      kinds[static_cast<size_t>(i)] = i && i % 4 == 0 ? "full_attention" : "linear_attention";
  }
  la.ignore({"chunk_size"});  // an fla kernel tile size; the math does not depend on it
  la.reject_unknown();
  bool any_attn = false;
  for (int64_t i = 0; i < n; ++i) {
    const std::string& kind = kinds[static_cast<size_t>(i)];
    MT_CHECK(kind == "linear_attention" || kind == "full_attention", ConfigError, source,
             ": layer ", i, " has no kind or an unknown one ('", kind, "')");
    c.layers[static_cast<size_t>(i)].mixer =
        kind == "linear_attention" ? MixerKind::Kda : MixerKind::Mla;
    any_attn |= kind == "full_attention";
  }
  require_positive(c.kda.heads, source, "linear_attn_config.num_heads");
  require_positive(c.kda.head_dim, source, "linear_attn_config.head_dim");
  require_positive(c.kda.conv_kernel, source, "linear_attn_config.short_conv_kernel_size");

  if (any_attn) {
    mla_common(k, c);
  } else {
    k.ignore({"num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
              "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "head_dim", "qk_head_dim"});
  }
  // transformers' kimi_linear attention is NoPE: the rope part of q/k is used without rotation,
  // so rope settings have no effect; mla_use_nope = false would need the rotation.
  c.mla.use_rope = false;
  k.only("mla_use_nope", true);
  k.ignore({"rope_theta", "rope_scaling", "rope_parameters"});
  c.dsa.mla = c.mla;

  deepseek_ffn(k, c, n, 1, source);
  k.only("num_nextn_predict_layers", int64_t{0});
  router_output_keys(k);
  k.reject_unknown();
  return h;
}

// deepseek_v3 (DeepSeek-V3/R1, Kimi-K2) and deepseek_v32 share everything but the attention:
// v3.2 adds the lightning indexer (DSA) to the same MLA.
HfConfig deepseek(const json& j, const std::string& source, bool indexer) {
  JsonKeys k(j, source);
  HfConfig h;
  ModelConfig& c = h.model;
  const int64_t n = text_model_keys(k, h, source, indexer ? "deepseek_v32" : "deepseek_v3", 1e-6f);
  const MixerKind mixer = indexer ? MixerKind::Dsa : MixerKind::Mla;
  c.layers.assign(static_cast<size_t>(n), LayerIR{mixer, FfnKind::Moe});
  if (k.has({"layer_types"})) {
    // transformers 5.17 wrote "deepseek_sparse_attention", 5.24 writes "indexed_attention"
    // (v3.2); v3 configs from 5.24 may list "full_attention". Other kinds change the math.
    auto kinds = k.get<std::vector<std::string>>({"layer_types"}, {});
    MT_CHECK(static_cast<int64_t>(kinds.size()) == n, ConfigError, source, ": layer_types has ",
             kinds.size(), " entries for ", n, " layers");
    for (size_t i = 0; i < kinds.size(); ++i) {
      const bool ok =
          indexer ? kinds[i] == "deepseek_sparse_attention" || kinds[i] == "indexed_attention"
                  : kinds[i] == "full_attention";
      MT_CHECK(ok, ConfigError, source, ": layer_types[", i, "] = '", kinds[i],
               "' is not supported");
    }
  }
  mla_common(k, c);
  if (indexer)
    require_positive(c.mla.q_lora_rank, source, "q_lora_rank (the indexer reads the query latent)");
  c.mla.use_rope = true;
  // transformers' DeepSeek attention de-interleaves q/k rope dims unless rope_interleave is off.
  c.mla.rope_style = k.get<bool>({"rope_interleave"}, true) ? ops::RopeStyle::Interleaved
                                                            : ops::RopeStyle::HalfSplit;
  rope_settings(k, c.mla, 163840);
  c.dsa.mla = c.mla;
  if (indexer) {
    c.dsa.index_heads = k.get<int64_t>({"index_n_heads"}, 64);
    c.dsa.index_head_dim = k.get<int64_t>({"index_head_dim"}, 128);
    c.dsa.index_rope_dim = c.mla.qk_rope_dim;
    c.dsa.index_topk = k.get<int64_t>({"index_topk"}, 2048);
    c.dsa.indexer_norm_eps = 1e-6f;
    // transformers runs the indexer under no_grad: its weights get no gradient from the LM loss.
    c.dsa.indexer_loss_coeff = 0.f;
    require_positive(c.dsa.index_heads, source, "index_n_heads");
    require_positive(c.dsa.index_head_dim, source, "index_head_dim");
    require_positive(c.dsa.index_topk, source, "index_topk");
    MT_CHECK(c.dsa.index_rope_dim <= c.dsa.index_head_dim, ConfigError, source,
             ": qk_rope_head_dim exceeds index_head_dim");
  }

  deepseek_ffn(k, c, n, 3, source);
  // Multi-token-prediction layers are not part of the causal LM; transformers drops them too.
  k.ignore({"num_nextn_predict_layers"});
  router_output_keys(k);
  k.reject_unknown();
  return h;
}

// kimi_k25: the deepseek_v3 language model (text_config) behind a vision tower and projector
// (vision_config, projection_*), whose rows replace the image_token_id placeholders.
HfConfig kimi_k25(const json& j, const std::string& source) {
  MT_CHECK(j.contains("text_config") && j["text_config"].is_object(), ConfigError, source,
           ": missing key 'text_config'");
  json text = j["text_config"];
  const std::string lm = text.value("model_type", std::string("deepseek_v3"));
  // Remote-code checkpoints call their language model kimi_k2; transformers reads it as v3.
  MT_CHECK(lm == "deepseek_v3" || lm == "kimi_k2", ConfigError, source,
           ".text_config: model_type '", lm, "' is not supported (deepseek_v3)");
  text["model_type"] = "deepseek_v3";
  HfConfig h = deepseek(text, source + ".text_config", false);
  ModelConfig& c = h.model;
  c.model_type = "kimi_k25";
  c.vision = std::make_shared<const VisionConfig>(vision_config_from_kimi_k25(j, source));
  c.image_token_id = j.value("image_token_id", int64_t{163605});
  MT_CHECK(c.image_token_id >= 0 && c.image_token_id < c.vocab, ConfigError, source,
           ": image_token_id ", c.image_token_id, " outside the vocabulary [0, ", c.vocab, ")");
  // The top-level tie (the default true) is what ties lm_head in transformers.
  c.tie_embeddings = j.value("tie_word_embeddings", true);
  return h;
}

}  // namespace

HfConfig hf_config_from_json(const json& j, const std::string& source) {
  MT_CHECK(j.is_object(), ConfigError, source, ": expected a JSON object");
  // Checked before anything else so that a quantized checkpoint gets this message, not one
  // about a tensor dtype or a scale tensor. Block-scaled FP8 (DeepSeek's) is dequantised on load;
  // other methods are refused.
  int64_t block_rows = 0, block_cols = 0;
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    const std::string method = q.is_object() && q.contains("quant_method")
                                   ? q["quant_method"].dump()
                                   : std::string("unspecified");
    MT_CHECK(method == "\"fp8\"", ConfigError, source, ": 'quantization_config' (quant_method ",
             method, ") is not supported (block-scaled fp8 is): dequantize the checkpoint first");
    JsonKeys qk(q, source + ".quantization_config");
    qk.ignore({"quant_method", "modules_to_not_convert"});
    // Activations are computed in the engine's precision, so how FP8 inference would scale them
    // does not apply.
    // scale_fmt (V3.2's ue8m0) rounds activation scales in DeepSeek's FP8 kernels; the weight
    // scales are stored as they are used.
    qk.ignore({"activation_scheme", "scale_fmt"});
    qk.only("fmt", std::string("e4m3"));
    const auto block = qk.get<std::vector<int64_t>>({"weight_block_size"}, {128, 128});
    MT_CHECK(block.size() == 2 && block[0] > 0 && block[1] > 0, ConfigError, qk.where(),
             ": 'weight_block_size' must be two positive integers");
    block_rows = block[0];
    block_cols = block[1];
    qk.reject_unknown();
  }
  MT_CHECK(j.contains("model_type") && j["model_type"].is_string(), ConfigError, source,
           ": missing key 'model_type'");
  std::string type = j["model_type"].get<std::string>();
  HfConfig h;
  if (type == "kimi_linear") {
    h = kimi_linear(j, source);
  } else if (type == "deepseek_v32" || type == "deepseek_v3") {
    h = deepseek(j, source, type == "deepseek_v32");
  } else if (type == "kimi_k25") {
    h = kimi_k25(j, source);
  } else if (type == "moetrain_hybrid") {
    h.model = ModelConfig::from_json(j, source);
  } else {
    MT_THROW(
        ConfigError, source, ": model_type '", type,
        "' is not supported (kimi_linear, kimi_k25, deepseek_v3, deepseek_v32, moetrain_hybrid)");
  }
  h.model_type = type;
  h.raw = j;
  h.fp8_block_rows = block_rows;
  h.fp8_block_cols = block_cols;
  return h;
}

HfConfig load_hf_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream f(p);
  MT_CHECK(f.good(), IoError, p.string(), ": cannot open");
  json j = json::parse(f, nullptr, false);
  MT_CHECK(!j.is_discarded(), ConfigError, p.string(), ": invalid JSON");
  return hf_config_from_json(j, p.string());
}

}  // namespace mt
