#include "model/model_config.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <type_traits>

#include "model/json_keys.h"
#include "model/presets_embedded.h"
#include "ops/moe_rules.h"

namespace mt {

using nlohmann::json;

constexpr EnumName<MixerKind> kMixerNames[] = {
    {MixerKind::Kda, "kda"}, {MixerKind::Dsa, "dsa"}, {MixerKind::Mla, "mla"}};
static_assert(std::size(kMixerNames) == static_cast<size_t>(MixerKind::Mla) + 1);

const char* mixer_name(MixerKind k) {
  return name_of(kMixerNames, k);
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  JsonKeys r(j, source);
  ModelConfig c;
  c.model_type = r.need<std::string>("model_type");
  MT_CHECK(c.model_type == "moetrain_hybrid", ConfigError, source, ": model_type '", c.model_type,
           "' is not supported here (expected moetrain_hybrid)");
  r.ignore("architectures");
  r.ignore("torch_dtype");
  r.ignore("transformers_version");
  c.vocab = r.need<int64_t>("vocab_size");
  c.hidden = r.need<int64_t>("hidden_size");
  c.max_positions = r.get<int64_t>("max_position_embeddings", 4096);
  int64_t n_layers = r.need<int64_t>("num_hidden_layers");
  require_positive(c.vocab, source, "vocab_size");
  require_positive(c.hidden, source, "hidden_size");
  require_positive(n_layers, source, "num_hidden_layers");
  c.norm_eps = r.get<float>("rms_norm_eps", 1e-5f);
  c.tie_embeddings = r.get<bool>("tie_word_embeddings", false);
  c.init_std = r.get<float>("initializer_range", 0.02f);

  auto kinds = r.need<std::vector<std::string>>("layer_types");
  MT_CHECK(static_cast<int64_t>(kinds.size()) == n_layers, ConfigError, source,
           ": layer_types has ", kinds.size(), " entries for num_hidden_layers ", n_layers);
  int64_t first_dense = r.get<int64_t>("first_k_dense_replace", 0);
  MT_CHECK(first_dense >= 0 && first_dense <= n_layers, ConfigError, source,
           ": first_k_dense_replace ", first_dense, " outside [0, ", n_layers, "]");
  bool any_kda = false, any_attn = false, any_dsa = false;
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string& k = kinds[static_cast<size_t>(i)];
    LayerIR l;
    const std::optional<MixerKind> mixer = value_of(kMixerNames, k);
    MT_CHECK(mixer, ConfigError, source, ": layer_types[", i, "] = '", k,
             "' (expected kda, dsa or mla)");
    l.mixer = *mixer;
    l.ffn = i < first_dense ? FfnKind::Dense : FfnKind::Moe;
    any_kda |= l.mixer == MixerKind::Kda;
    any_attn |= l.mixer != MixerKind::Kda;
    any_dsa |= l.mixer == MixerKind::Dsa;
    c.layers.push_back(l);
  }

  if (any_kda) {
    JsonKeys k = r.child("linear_attn_config");
    c.kda.hidden = c.hidden;
    c.kda.heads = k.need<int64_t>("num_heads");
    c.kda.head_dim = k.need<int64_t>("head_dim");
    c.kda.conv_kernel = k.get<int64_t>("short_conv_kernel_size", 4);
    c.kda.chunk = k.get<int64_t>("chunk_size", 64);
    c.kda.norm_eps = c.norm_eps;
    require_positive(c.kda.heads, k.where(), "num_heads");
    require_positive(c.kda.head_dim, k.where(), "head_dim");
    require_positive(c.kda.chunk, k.where(), "chunk_size");
    k.reject_unknown();
  } else {
    r.ignore("linear_attn_config");
  }

  c.mla.hidden = c.hidden;
  c.mla.heads = r.get<int64_t>("num_attention_heads", 0);
  c.mla.q_lora_rank = r.get<int64_t>("q_lora_rank", 0);
  c.mla.kv_lora_rank = r.get<int64_t>("kv_lora_rank", 0);
  c.mla.qk_nope_dim = r.get<int64_t>("qk_nope_head_dim", 0);
  c.mla.qk_rope_dim = r.get<int64_t>("qk_rope_head_dim", 0);
  c.mla.v_head_dim = r.get<int64_t>("v_head_dim", 0);
  c.mla.rope_theta = r.get<float>("rope_theta", 10000.f);
  c.mla.rope_style = r.get<bool>("rope_interleave", true) ? ops::RopeStyle::Interleaved
                                                          : ops::RopeStyle::HalfSplit;
  c.mla.output_gate = r.get<bool>("attn_output_gate", false);
  c.mla.norm_eps = 1e-6f;
  if (any_attn) {
    require_positive(c.mla.heads, source, "num_attention_heads");
    require_positive(c.mla.kv_lora_rank, source, "kv_lora_rank");
    require_positive(c.mla.qk_nope_dim + c.mla.qk_rope_dim, source,
                     "qk_nope_head_dim + qk_rope_head_dim");
    require_positive(c.mla.v_head_dim, source, "v_head_dim");
    MT_CHECK(c.mla.qk_rope_dim % 2 == 0, ConfigError, source, ": qk_rope_head_dim must be even");
  }
  c.dsa.mla = c.mla;
  c.dsa.index_heads = r.get<int64_t>("index_n_heads", 0);
  c.dsa.index_head_dim = r.get<int64_t>("index_head_dim", 0);
  c.dsa.index_rope_dim = c.mla.qk_rope_dim;
  c.dsa.index_topk = r.get<int64_t>("index_topk", 0);
  c.dsa.indexer_loss_coeff = r.get<float>("indexer_loss_coef", 1.0f);
  if (any_dsa) {
    require_positive(c.dsa.index_heads, source, "index_n_heads");
    require_positive(c.dsa.index_head_dim, source, "index_head_dim");
    require_positive(c.dsa.index_topk, source, "index_topk");
    require_positive(c.mla.q_lora_rank, source, "q_lora_rank (DSA layers need the query latent)");
    MT_CHECK(c.dsa.index_rope_dim <= c.dsa.index_head_dim, ConfigError, source,
             ": qk_rope_head_dim exceeds index_head_dim");
  }

  c.dense.hidden = c.hidden;
  c.dense.ffn = r.get<int64_t>("intermediate_size", 0);
  if (first_dense > 0) require_positive(c.dense.ffn, source, "intermediate_size");

  bool any_moe = first_dense < n_layers;
  c.moe.hidden = c.hidden;
  c.moe.num_experts = r.get<int64_t>("n_routed_experts", 0);
  c.moe.top_k = r.get<int64_t>("num_experts_per_tok", 0);
  c.moe.expert_ffn = r.get<int64_t>("moe_intermediate_size", 0);
  c.moe.latent = r.get<int64_t>("moe_latent_size", c.hidden);
  c.moe.num_shared = r.get<int64_t>("n_shared_experts", 0);
  c.moe.shared_ffn = c.moe.expert_ffn;
  std::string scoring = r.get<std::string>("scoring_func", "sigmoid");
  MT_CHECK(scoring == "sigmoid" || scoring == "softmax", ConfigError, source, ": scoring_func '",
           scoring, "' (expected sigmoid or softmax)");
  c.moe.score = scoring == "sigmoid" ? RouterScore::Sigmoid : RouterScore::Softmax;
  c.moe.n_group = r.get<int64_t>("n_group", 1);
  c.moe.topk_group = r.get<int64_t>("topk_group", c.moe.n_group);
  c.moe.norm_topk_prob = r.get<bool>("norm_topk_prob", true);
  c.moe.routed_scaling = r.get<float>("routed_scaling_factor", 1.0f);
  std::string method = r.get<std::string>("topk_method", "noaux_tc");
  MT_CHECK(method == "noaux_tc" || method == "greedy", ConfigError, source, ": topk_method '",
           method, "' (expected noaux_tc or greedy)");
  c.moe.selection_bias = method == "noaux_tc";
  c.moe.bias_update_rate = r.get<float>("router_bias_update_rate", 1e-3f);
  c.moe.seq_aux_coeff = r.get<float>("router_aux_loss_coef", 0.0f);
  c.moe.z_loss_coeff = r.get<float>("router_z_loss_coef", 0.0f);
  if (any_moe) {
    require_positive(c.moe.num_experts, source, "n_routed_experts");
    require_positive(c.moe.top_k, source, "num_experts_per_tok");
    require_positive(c.moe.expert_ffn, source, "moe_intermediate_size");
    require_positive(c.moe.latent, source, "moe_latent_size");
    MT_CHECK(c.moe.latent <= c.hidden, ConfigError, source, ": moe_latent_size ", c.moe.latent,
             " exceeds hidden_size ", c.hidden);
    const std::string routing =
        ops::routing_error(c.moe.num_experts, c.moe.top_k, c.moe.n_group, c.moe.topk_group);
    MT_CHECK(routing.empty(), ConfigError, source, ": ", routing);
  }
  r.reject_unknown();
  return c;
}

json ModelConfig::to_json() const {
  json j;
  j["model_type"] = model_type;
  j["vocab_size"] = vocab;
  j["hidden_size"] = hidden;
  j["max_position_embeddings"] = max_positions;
  j["num_hidden_layers"] = layers.size();
  std::vector<std::string> kinds;
  int64_t first_dense = 0;
  for (const LayerIR& l : layers) {
    kinds.push_back(mixer_name(l.mixer));
    if (l.ffn == FfnKind::Dense) ++first_dense;
  }
  j["layer_types"] = kinds;
  j["first_k_dense_replace"] = first_dense;
  j["rms_norm_eps"] = norm_eps;
  j["tie_word_embeddings"] = tie_embeddings;
  j["initializer_range"] = init_std;
  j["linear_attn_config"] = {{"num_heads", kda.heads},
                             {"head_dim", kda.head_dim},
                             {"short_conv_kernel_size", kda.conv_kernel},
                             {"chunk_size", kda.chunk}};
  j["num_attention_heads"] = mla.heads;
  j["q_lora_rank"] = mla.q_lora_rank;
  j["kv_lora_rank"] = mla.kv_lora_rank;
  j["qk_nope_head_dim"] = mla.qk_nope_dim;
  j["qk_rope_head_dim"] = mla.qk_rope_dim;
  j["v_head_dim"] = mla.v_head_dim;
  j["rope_theta"] = mla.rope_theta;
  j["rope_interleave"] = mla.rope_style == ops::RopeStyle::Interleaved;
  j["attn_output_gate"] = mla.output_gate;
  j["index_n_heads"] = dsa.index_heads;
  j["index_head_dim"] = dsa.index_head_dim;
  j["index_topk"] = dsa.index_topk;
  j["indexer_loss_coef"] = dsa.indexer_loss_coeff;
  j["intermediate_size"] = dense.ffn;
  j["n_routed_experts"] = moe.num_experts;
  j["num_experts_per_tok"] = moe.top_k;
  j["moe_intermediate_size"] = moe.expert_ffn;
  j["moe_latent_size"] = moe.latent;
  j["n_shared_experts"] = moe.num_shared;
  j["scoring_func"] = moe.score == RouterScore::Sigmoid ? "sigmoid" : "softmax";
  j["n_group"] = moe.n_group;
  j["topk_group"] = moe.topk_group;
  j["norm_topk_prob"] = moe.norm_topk_prob;
  j["routed_scaling_factor"] = moe.routed_scaling;
  j["topk_method"] = moe.selection_bias ? "noaux_tc" : "greedy";
  j["router_bias_update_rate"] = moe.bias_update_rate;
  j["router_aux_loss_coef"] = moe.seq_aux_coeff;
  j["router_z_loss_coef"] = moe.z_loss_coeff;
  return j;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kEmbeddedPresets) names.emplace_back(p.name);
  return names;
}

ModelConfig ModelConfig::load(const std::string& name_or_path) {
  for (const auto& p : kEmbeddedPresets)
    if (name_or_path == p.name) {
      return from_json(json::parse(p.json), std::string("preset '") + p.name + "'");
    }
  std::filesystem::path path(name_or_path);
  if (std::filesystem::is_directory(path)) path /= "config.json";
  std::ifstream f(path);
  MT_CHECK(f.good(), IoError, "cannot open model config '", path.string(),
           "' (not a file, a model directory, or a preset: tiny, small, seed-2.8t)");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    MT_THROW(ConfigError, path.string(), ": invalid JSON: ", e.what());
  }
  return from_json(j, path.string());
}

}  // namespace mt
