#include "io/hf_names.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

namespace mt {
namespace {

namespace fs = std::filesystem;

// One HF tensor and the engine parameters it is made of (several: concatenated along dim 0).
struct Group {
  std::string hf_name;
  Shape hf_shape;
  std::vector<Param*> parts;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string forget_gate_name(const std::string& n);

std::vector<Group> groups(const Model& m, const std::string& model_type) {
  const bool kimi = model_type == "kimi_linear";
  std::vector<Group> out;
  std::map<std::string, size_t> conv;  // fused conv1d name -> group index
  for (const auto& up : m.params().all()) {
    Param* p = up.get();
    const std::string& n = p->name;
    if (kimi && (ends_with(n, ".q_conv1d.weight") || ends_with(n, ".k_conv1d.weight") ||
                 ends_with(n, ".v_conv1d.weight"))) {
      std::string fused = n.substr(0, n.size() - std::strlen("q_conv1d.weight")) + "conv1d.weight";
      auto it = conv.find(fused);
      if (it == conv.end()) {
        it = conv.emplace(fused, out.size()).first;
        out.push_back({fused, Shape{}, {}});
      }
      out[it->second].parts.push_back(p);
      continue;
    }
    if (kimi && ends_with(n, ".self_attn.A_log")) {
      out.push_back({forget_gate_name(n), Shape{1, 1, p->value.numel(), 1}, {p}});
      continue;
    }
    out.push_back({kimi ? forget_gate_name(n) : n, p->value.shape(), {p}});
  }
  for (auto& [name, gi] : conv) {
    Group& g = out[gi];
    // Keep q, k, v order regardless of declaration order.
    std::sort(g.parts.begin(), g.parts.end(), [](Param* a, Param* b) {
      auto rank = [](const std::string& s) {
        return ends_with(s, ".q_conv1d.weight") ? 0 : ends_with(s, ".k_conv1d.weight") ? 1 : 2;
      };
      return rank(a->name) < rank(b->name);
    });
    int64_t rows = 0;
    for (Param* p : g.parts) rows += p->value.dim(0);
    std::vector<int64_t> d = g.parts[0]->value.shape().dims();
    d[0] = rows;
    g.hf_shape = Shape(d);
  }
  return out;
}

// transformers' kimi_linear nests the KDA decay parameters in a forget_gate module; the engine
// keeps them directly in self_attn (as the original checkpoints do).
std::string forget_gate_name(const std::string& n) {
  for (const char* leaf : {"A_log", "dt_bias", "f_a_proj.", "f_b_proj."}) {
    const std::string key = std::string(".self_attn.") + leaf;
    size_t at = n.find(key);
    if (at != std::string::npos)
      return n.substr(0, at) + ".self_attn.forget_gate." +
             n.substr(at + std::strlen(".self_attn."));
  }
  return n;
}

// Replaces every occurrence of `from` by `to`.
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// Checkpoint spellings -> transformers' runtime names. Original kimi_linear checkpoints use
// block_sparse_moe, experts.N.w1/w3/w2 (gate/up/down), self_attn.{A_log,dt_bias,f_a_proj,
// f_b_proj} and separate q/k/v_conv1d; deepseek_v32 checkpoints use per-expert tensors (fused
// later by fuse_experts).
TensorMap normalize_checkpoint(const std::string& model_type, const TensorMap& in) {
  if (model_type != "kimi_linear") return in;
  TensorMap out;
  std::map<std::string, std::array<Tensor, 3>> convs;
  for (const auto& [name, t] : in) {
    std::string n = replace_all(name, ".block_sparse_moe.", ".mlp.");
    if (n.find(".mlp.experts.") != std::string::npos) {
      n = replace_all(n, ".w1.weight", ".gate_proj.weight");
      n = replace_all(n, ".w3.weight", ".up_proj.weight");
      n = replace_all(n, ".w2.weight", ".down_proj.weight");
    }
    if (n.find(".forget_gate.") == std::string::npos) n = forget_gate_name(n);
    bool conv = false;
    for (int i = 0; i < 3; ++i) {
      const std::string leaf = std::string(".self_attn.") + "qkv"[i] + "_conv1d.weight";
      if (ends_with(n, leaf)) {
        convs[n.substr(0, n.size() - leaf.size()) + ".self_attn.conv1d.weight"][i] = t;
        conv = true;
      }
    }
    if (!conv) out[n] = t;
  }
  for (auto& [name, parts] : convs) {
    bool complete = parts[0].defined() && parts[1].defined() && parts[2].defined() &&
                    parts[0].shape() == parts[1].shape() && parts[0].shape() == parts[2].shape() &&
                    parts[0].ndim() >= 1 && parts[0].dtype() == DType::F32;
    if (!complete) {  // leave them under their own names: reported as unexpected/missing
      for (int i = 0; i < 3; ++i)
        if (parts[i].defined())
          out[name.substr(0, name.size() - std::strlen("conv1d.weight")) + "qkv"[i] +
              "_conv1d.weight"] = parts[i];
      continue;
    }
    std::vector<int64_t> d = parts[0].shape().dims();
    d[0] *= 3;
    Tensor f = Tensor::empty(Shape(d));
    char* dst = static_cast<char*>(f.raw());
    for (const Tensor& p : parts) {
      std::memcpy(dst, p.raw(), p.bytes());
      dst += p.bytes();
    }
    out[name] = f;
  }
  return out;
}

// transformers' runtime names -> the spelling its checkpoints use (what save_pretrained writes
// and from_pretrained converts back): per-expert tensors, and kimi's original names.
TensorMap to_checkpoint(const std::string& model_type, const TensorMap& in) {
  const bool kimi = model_type == "kimi_linear";
  if (!kimi && model_type != "deepseek_v32") return in;
  TensorMap out;
  for (const auto& [name, t] : in) {
    std::string n = name;
    if (kimi) {
      n = replace_all(n, ".self_attn.forget_gate.", ".self_attn.");
      if (ends_with(n, ".self_attn.conv1d.weight")) {
        const std::string base = n.substr(0, n.size() - std::strlen("conv1d.weight"));
        const int64_t rows = t.dim(0) / 3;
        for (int i = 0; i < 3; ++i)
          out[base + "qkv"[i] + "_conv1d.weight"] = t.rows(i * rows, (i + 1) * rows).clone();
        continue;
      }
    }
    const bool gate_up = ends_with(n, ".mlp.experts.gate_up_proj");
    const bool down = ends_with(n, ".mlp.experts.down_proj");
    if (gate_up || down) {
      std::string base = n.substr(0, n.rfind('.') + 1);
      if (kimi) base = replace_all(base, ".mlp.", ".block_sparse_moe.");
      const int64_t E = t.dim(0), R = t.dim(1), C = t.dim(2);
      for (int64_t e = 0; e < E; ++e) {
        Tensor w = t.rows(e, e + 1).view({R, C});
        const std::string b = base + std::to_string(e) + ".";
        if (gate_up) {
          out[b + (kimi ? "w1.weight" : "gate_proj.weight")] = w.rows(0, R / 2).clone();
          out[b + (kimi ? "w3.weight" : "up_proj.weight")] = w.rows(R / 2, R).clone();
        } else {
          out[b + (kimi ? "w2.weight" : "down_proj.weight")] = w.clone();
        }
      }
      continue;
    }
    if (kimi) n = replace_all(n, ".mlp.", ".block_sparse_moe.");
    out[n] = t;
  }
  return out;
}

// Layer index of "model.layers.N.", or -1.
int64_t layer_of(const std::string& name) {
  static const std::string pre = "model.layers.";
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  size_t end = name.find('.', pre.size());
  if (end == std::string::npos) return -1;
  try {
    return std::stoll(name.substr(pre.size(), end - pre.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

// Fuses per-expert tensors (mlp.experts.N.gate_proj.weight ...) of one MoE layer into the v5
// layout, consuming them from `pool`. Returns false when none exist.
bool fuse_experts(const std::string& prefix, int64_t E, int64_t F, int64_t d, TensorMap& pool,
                  std::set<std::string>& consumed, std::vector<std::string>& problems,
                  Tensor& gate_up, Tensor& down) {
  if (!pool.count(prefix + "0.gate_proj.weight")) return false;
  gate_up = Tensor::empty({E, 2 * F, d});
  down = Tensor::empty({E, d, F});
  bool ok = true;
  for (int64_t e = 0; e < E; ++e) {
    const std::string b = prefix + std::to_string(e) + ".";
    struct Part {
      std::string name;
      Shape shape;
      float* dst;
    } parts[] = {{b + "gate_proj.weight", {F, d}, gate_up.f32() + e * 2 * F * d},
                 {b + "up_proj.weight", {F, d}, gate_up.f32() + (e * 2 + 1) * F * d},
                 {b + "down_proj.weight", {d, F}, down.f32() + e * d * F}};
    for (auto& part : parts) {
      auto it = pool.find(part.name);
      if (it == pool.end()) {
        problems.push_back("missing " + part.name + " " + part.shape.str());
        ok = false;
        continue;
      }
      consumed.insert(part.name);
      if (it->second.shape() != part.shape || it->second.dtype() != DType::F32) {
        problems.push_back("mis-shaped " + part.name + ": file " + it->second.shape().str() +
                           ", expected " + part.shape.str());
        ok = false;
        continue;
      }
      std::memcpy(part.dst, it->second.raw(), it->second.bytes());
    }
  }
  (void)ok;
  return true;
}

}  // namespace

TensorMap export_hf_tensors(const Model& m, const std::string& model_type, bool grads) {
  TensorMap out;
  for (const Group& g : groups(m, model_type)) {
    bool skip = false;
    for (Param* p : g.parts)
      skip |= grads && (!p->trainable() || p->spec.role == ParamRole::Buffer);
    if (skip) continue;
    Tensor t = Tensor::empty(g.hf_shape);
    char* dst = static_cast<char*>(t.raw());
    for (Param* p : g.parts) {
      const Tensor& src = grads ? p->grad : p->value;
      Tensor f = Tensor::empty(src.shape());
      f.copy_from(src);
      std::memcpy(dst, f.raw(), f.bytes());
      dst += f.bytes();
    }
    out.emplace(g.hf_name, std::move(t));
  }
  return out;
}

void import_hf_tensors(Model& m, const std::string& model_type, const TensorMap& tensors,
                       const std::string& source) {
  TensorMap pool = normalize_checkpoint(model_type, tensors);
  std::set<std::string> consumed;
  std::vector<std::string> problems;
  const ModelConfig& cfg = m.config();
  for (const Group& g : groups(m, model_type)) {
    Tensor src;
    auto it = pool.find(g.hf_name);
    if (it != pool.end()) {
      consumed.insert(g.hf_name);
      src = it->second;
    } else if (ends_with(g.hf_name, ".mlp.experts.gate_up_proj") ||
               ends_with(g.hf_name, ".mlp.experts.down_proj")) {
      // Per-expert checkpoints: fuse once per layer (on gate_up), then take the part needed.
      const std::string base = g.hf_name.substr(0, g.hf_name.rfind('.') + 1);
      Tensor gu, dn;
      if (fuse_experts(base, cfg.moe.num_experts, cfg.moe.expert_ffn, cfg.moe.latent, pool,
                       consumed, problems, gu, dn)) {
        if (!gu.defined()) continue;
        src = ends_with(g.hf_name, "gate_up_proj") ? gu : dn;
      }
    }
    if (!src.defined()) {
      if (g.hf_name == "lm_head.weight" && cfg.tie_embeddings) continue;
      problems.push_back("missing " + g.hf_name + " " + g.hf_shape.str());
      continue;
    }
    if (src.shape() != g.hf_shape || (src.dtype() != DType::F32)) {
      problems.push_back("mis-shaped " + g.hf_name + ": file " + src.shape().str() + " " +
                         std::string(dtype_name(src.dtype())) + ", expected " + g.hf_shape.str());
      continue;
    }
    const char* p = static_cast<const char*>(src.raw());
    for (Param* part : g.parts) {
      Tensor view(const_cast<char*>(p), part->value.shape(), DType::F32);
      part->value.copy_from(view);
      p += view.bytes();
    }
  }
  const int64_t n_layers = static_cast<int64_t>(cfg.layers.size());
  for (const auto& [name, t] : pool) {
    if (consumed.count(name)) continue;
    if (layer_of(name) >= n_layers) continue;              // multi-token-prediction layers
    if (ends_with(name, "rotary_emb.inv_freq")) continue;  // a derived buffer in old checkpoints
    // transformers keeps zero-width modules (e.g. shared experts with n_shared_experts = 0);
    // they hold no values, and the engine simply has no such parameter.
    if (t.numel() == 0) continue;
    if (name == "lm_head.weight" && cfg.tie_embeddings) continue;
    problems.push_back("unexpected " + name + " " + t.shape().str());
  }
  if (problems.empty()) return;
  // Per-expert problems are found once per fused tensor (gate_up and down); report each once.
  std::sort(problems.begin(), problems.end());
  problems.erase(std::unique(problems.begin(), problems.end()), problems.end());
  std::string msg = source + ": " + std::to_string(problems.size()) + " tensor problem(s):";
  for (const auto& s : problems) msg += "\n  " + s;
  MT_THROW(ShapeError, msg);
}

LoadedModel load_hf_model(const std::string& dir, const ModelOptions& opt) {
  LoadedModel lm;
  lm.config = load_hf_config(dir);
  lm.model = std::make_unique<Model>(lm.config.model, /*seed=*/0, opt);
  SafetensorsData data = read_safetensors_model(dir);
  import_hf_tensors(*lm.model, lm.config.model_type, data.tensors, dir);
  return lm;
}

std::string hf_runtime_name(const std::string& model_type, const std::string& engine_name) {
  return model_type == "kimi_linear" ? forget_gate_name(engine_name) : engine_name;
}

HfConfig hybrid_hf_config(const ModelConfig& cfg) {
  HfConfig h;
  h.model = cfg;
  h.model_type = cfg.model_type;
  h.raw = cfg.to_json();
  return h;
}

void save_hf_model(const Model& m, const HfConfig& cfg, const std::string& dir,
                   uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, IoError, dir, ": cannot create directory: ", ec.message());
  TensorMap t = to_checkpoint(cfg.model_type, export_hf_tensors(m, cfg.model_type, false));
  if (cfg.model.tie_embeddings) t.erase("lm_head.weight");
  write_safetensors_sharded(dir, t, {{"format", "pt"}}, max_shard_bytes);
  // config.json last, through a temporary name, so a directory with a config is complete.
  fs::path final_path = fs::path(dir) / "config.json";
  fs::path tmp = final_path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp);
    f << cfg.raw.dump(2) << "\n";
    f.flush();
    MT_CHECK(f.good(), IoError, tmp.string(), ": write failed");
  }
  fs::rename(tmp, final_path, ec);
  MT_CHECK(!ec, IoError, final_path.string(), ": rename failed: ", ec.message());
}

}  // namespace mt
