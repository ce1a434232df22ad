#include "model/vision/vision_config.h"

#include <set>
#include <utility>
#include <vector>

namespace mt {

namespace {

using nlohmann::json;

// Typed reads from one JSON object; keys never read are reported as unknown.
class Keys {
 public:
  Keys(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    MT_CHECK(j.is_object(), ConfigError, where_, ": expected a JSON object");
  }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  template <typename T>
  T get(const char* key, T fallback) {
    used_.insert(key);
    return has(key) ? as<T>(key) : fallback;
  }
  template <typename T>
  T need(const char* key) {
    used_.insert(key);
    MT_CHECK(has(key), ConfigError, where_, ": missing key '", key, "'");
    return as<T>(key);
  }
  const json& at(const char* key) {
    used_.insert(key);
    return j_.at(key);
  }
  void ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) used_.insert(k);
  }
  template <typename T>
  void only(const char* key, T allowed) {
    used_.insert(key);
    if (!has(key)) return;
    MT_CHECK(as<T>(key) == allowed, ConfigError, where_, ": '", key, "' = ", j_.at(key).dump(),
             " is not supported (only ", json(allowed).dump(), ")");
  }
  void refuse(std::initializer_list<const char*> keys, const char* why) const {
    for (const char* k : keys)
      MT_CHECK(!has(k), ConfigError, where_, ": '", k, "' is not supported (", why, ")");
  }
  void reject_unknown() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      MT_CHECK(used_.count(it.key()), ConfigError, where_, ": unknown or unsupported key '",
               it.key(), "'");
  }
  const std::string& where() const { return where_; }

 private:
  template <typename T>
  T as(const char* key) const {
    try {
      return j_.at(key).get<T>();
    } catch (const json::exception&) {
      MT_THROW(ConfigError, where_, ": key '", key, "' has the wrong type (",
               j_.at(key).type_name(), ")");
    }
  }
  const json& j_;
  std::string where_;
  std::set<std::string> used_;
};

void positive(int64_t v, const std::string& where, const char* key) {
  MT_CHECK(v > 0, ConfigError, where, ": '", key, "' must be positive, got ", v);
}

// Keys PreTrainedConfig writes into every (sub-)config; none changes the tower's math.
void ignore_generic(Keys& k) {
  k.ignore({"architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
            "initializer_range", "output_attentions", "output_hidden_states", "return_dict",
            "id2label", "label2id", "use_cache", "chunk_size_feed_forward", "is_encoder_decoder",
            "problem_type", "tie_word_embeddings", "_attn_implementation_autoset"});
}

constexpr const char* kVideo = "video / time-axis inputs have no engine path; images only";

}  // namespace

VisionConfig vision_config_from_kimi_k25(const json& config, const std::string& source) {
  Keys top(config, source);
  const std::string type = top.get<std::string>("model_type", "");
  MT_CHECK(type == "kimi_k25", ConfigError, source, ": model_type '", type,
           "' is not kimi_k25 (the vision parser reads kimi_k25 configs)");
  MT_CHECK(top.has("vision_config"), ConfigError, source, ": missing key 'vision_config'");
  MT_CHECK(top.has("text_config"), ConfigError, source, ": missing key 'text_config'");
  VisionConfig c;
  {
    Keys v(top.at("vision_config"), source + ".vision_config");
    ignore_generic(v);
    v.only("model_type", std::string("kimi_k25_vision"));
    // The remote-code (pre-transformers) checkpoints' time-axis keys.
    v.refuse({"video_attn_type", "temporal_merge_kernel_size", "temporal_patch_size",
              "init_pos_emb_time", "merge_type"},
             kVideo);
    c.patch_size = v.get<int64_t>("patch_size", c.patch_size);
    c.pos_rows = v.get<int64_t>("pos_emb_height", c.pos_rows);
    c.pos_cols = v.get<int64_t>("pos_emb_width", c.pos_cols);
    // The temporal table is a fixed sinusoid (no weights) whose row 0, the one every image
    // reads, is zero: its size does not change image math, so it is read and not used.
    v.get<int64_t>("pos_emb_time", 0);
    c.heads = v.get<int64_t>("num_attention_heads", c.heads);
    c.layers = v.get<int64_t>("num_hidden_layers", c.layers);
    c.hidden = v.get<int64_t>("hidden_size", c.hidden);
    c.intermediate = v.get<int64_t>("intermediate_size", c.intermediate);
    v.only("hidden_act", std::string("gelu_pytorch_tanh"));
    v.only("num_channels", int64_t{3});
    if (v.has("merge_kernel_size")) {
      const auto m = v.get<std::vector<int64_t>>("merge_kernel_size", {});
      MT_CHECK(m.size() == 2, ConfigError, v.where(), ": 'merge_kernel_size' must be [rows, cols]");
      c.merge_rows = m[0];
      c.merge_cols = m[1];
    } else {
      v.ignore({"merge_kernel_size"});
    }
    if (v.has("rope_parameters")) {
      Keys r(v.at("rope_parameters"), v.where() + ".rope_parameters");
      r.only("rope_type", std::string("axial"));
      c.rope_theta = static_cast<float>(r.get<double>("rope_theta", c.rope_theta));
      r.reject_unknown();
    } else {
      v.ignore({"rope_parameters"});
    }
    c.rope_theta = static_cast<float>(v.get<double>("rope_theta", c.rope_theta));
    v.reject_unknown();
    const std::string& w = v.where();
    const std::vector<std::pair<const char*, int64_t>> sizes{
        {"patch_size", c.patch_size},          {"pos_emb_height", c.pos_rows},
        {"pos_emb_width", c.pos_cols},         {"num_attention_heads", c.heads},
        {"num_hidden_layers", c.layers},       {"hidden_size", c.hidden},
        {"intermediate_size", c.intermediate}, {"merge_kernel_size", c.merge_rows},
        {"merge_kernel_size", c.merge_cols}};
    for (const auto& [key, val] : sizes) positive(val, w, key);
    // transformers indexes the flattened table with pos_emb_height as the row length, which is
    // the table's layout only when it is square.
    MT_CHECK(c.pos_rows == c.pos_cols, ConfigError, w, ": pos_emb_height ", c.pos_rows,
             " != pos_emb_width ", c.pos_cols, " (transformers resamples a square table)");
    MT_CHECK(c.hidden % c.heads == 0 && (c.hidden / c.heads) % 4 == 0, ConfigError, w,
             ": hidden_size ", c.hidden, " / num_attention_heads ", c.heads,
             " must be a head dimension divisible by 4 (axial 2-D RoPE)");
    MT_CHECK(c.rope_theta > 1.f, ConfigError, w, ": rope_theta must be > 1, got ", c.rope_theta);
  }
  {
    Keys t(top.at("text_config"), source + ".text_config");
    c.text_hidden = t.need<int64_t>("hidden_size");
    positive(c.text_hidden, t.where(), "hidden_size");
    // The language model's own keys belong to its parser (deepseek_v3), not to this one.
  }
  const int64_t proj_hidden = top.get<int64_t>("projection_hidden_size", c.hidden);
  MT_CHECK(proj_hidden == c.hidden, ConfigError, source, ": projection_hidden_size ", proj_hidden,
           " must equal vision_config.hidden_size ", c.hidden,
           " (the projector's LayerNorm runs on each patch)");
  c.projector_eps = static_cast<float>(top.get<double>("projection_layer_norm_eps", 1e-5));
  MT_CHECK(c.projector_eps > 0.f, ConfigError, source,
           ": projection_layer_norm_eps must be positive");
  // Token ids and the embedding tie are the language model's and the data path's business.
  top.ignore({"image_token_id", "vision_start_token_id", "vision_end_token_id",
              "media_placeholder_token_id", "pad_token_id", "bos_token_id", "eos_token_id",
              "video_token_id"});
  ignore_generic(top);
  top.reject_unknown();
  return c;
}

}  // namespace mt
