#include "model/vision/vision_config.h"

#include <set>
#include <utility>
#include <vector>

#include "model/json_keys.h"

namespace mt {

namespace {

using nlohmann::json;

// Keys PreTrainedConfig writes into every (sub-)config, and the two the kimi_k25 configs add;
// none changes the tower's math.
void ignore_generic(JsonKeys& k) {
  k.ignore_pretrained_config();
  k.ignore({"tie_word_embeddings", "_attn_implementation_autoset"});
}

constexpr const char* kVideo = "video / time-axis inputs have no engine path; images only";

}  // namespace

VisionConfig vision_config_from_kimi_k25(const json& config, const std::string& source) {
  JsonKeys top(config, source);
  const std::string type = top.get<std::string>("model_type", "");
  MT_CHECK(type == "kimi_k25", ConfigError, source, ": model_type '", type,
           "' is not kimi_k25 (the vision parser reads kimi_k25 configs)");
  MT_CHECK(top.has("vision_config"), ConfigError, source, ": missing key 'vision_config'");
  MT_CHECK(top.has("text_config"), ConfigError, source, ": missing key 'text_config'");
  VisionConfig c;
  {
    JsonKeys v = top.child("vision_config");
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
      JsonKeys r = v.child("rope_parameters");
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
    for (const auto& [key, val] : sizes) require_positive(val, w, key);
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
    JsonKeys t = top.child("text_config");
    c.text_hidden = t.need<int64_t>("hidden_size");
    require_positive(c.text_hidden, t.where(), "hidden_size");
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
