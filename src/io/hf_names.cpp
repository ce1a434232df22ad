#include "io/hf_names.h"

#include "model/vision/vision_config.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
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
std::string k25_runtime_name(const std::string& n);

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
      out.push_back({forget_gate_name(n), Shape{1, 1, p->spec.shape.numel(), 1}, {p}});
      continue;
    }
    out.push_back({kimi                       ? forget_gate_name(n)
                   : model_type == "kimi_k25" ? k25_runtime_name(n)
                                              : n,
                   p->spec.shape,
                   {p}});
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
    for (Param* p : g.parts) rows += p->spec.shape[0];
    std::vector<int64_t> d = g.parts[0]->spec.shape.dims();
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

// A checkpoint tensor not yet read: its shape and dtype as loaded, the file it is in ("" for
// tensors already in memory) and how to read it.
struct Source {
  Shape shape;
  DType dtype = DType::F32;
  std::string file;
  uint64_t bytes = 0;  // in the file (progress)
  // Decodes the tensor into `dst` (contiguous, `dtype`, as many elements as `shape`).
  std::function<void(Tensor& dst)> read_into;
  // Elements [begin, begin + count) of the flattened f32 tensor into `out`, decoding only those
  // (null: the source cannot slice, and read_range decodes it whole).
  std::function<void(int64_t begin, int64_t count, float* out)> range;
  Tensor read() const {
    Tensor t = Tensor::empty(shape, dtype);
    read_into(t);
    return t;
  }
  void read_range(int64_t begin, int64_t count, float* out) const {
    if (range) return range(begin, count, out);
    const Tensor all = read();
    std::copy_n(all.f32() + begin, count, out);
  }
};
using Pool = std::map<std::string, Source>;

Pool pool_of(const TensorMap& tensors) {
  Pool p;
  // `t = t`: clang before 16 cannot capture a structured binding by name (tools/fuzz.sh builds
  // with clang 14).
  for (const auto& [name, t] : tensors)
    p[name] = {t.shape(), t.dtype(), "", t.bytes(), [t = t](Tensor& dst) { dst.copy_from(t); }, {}};
  return p;
}

Pool pool_of(const SafetensorsModel& st) {
  Pool p;
  for (const std::string& name : st.names()) {
    const SafetensorsEntry& e = st.entry(name);
    p[name] = {Shape(e.shape),
               st.loaded_dtype(name),
               fs::path(st.file_of(name)).filename(),
               e.end - e.begin,
               [&st, name](Tensor& dst) { st.read_into(name, dst); },
               [&st, name](int64_t begin, int64_t count, float* out) {
                 st.read_range(name, begin, count, out);
               }};
  }
  return p;
}

std::string in_file(const Source& s) {
  return s.file.empty() ? "" : " (in " + s.file + ")";
}

// kimi_k25 keeps its language model under model.language_model.; the engine's LM parameters
// carry the plain causal-LM names (model.layers.N..., model.embed_tokens..., model.norm...).
std::string k25_runtime_name(const std::string& n) {
  const bool vision =
      n.rfind("model.vision_tower.", 0) == 0 || n.rfind("model.mm_projector.", 0) == 0;
  if (vision || n.rfind("model.", 0) != 0) return n;
  return "model.language_model." + n.substr(6);
}

// kimi_k25 checkpoints as save_pretrained writes them (the original remote-code spelling) ->
// transformers' runtime names: language_model.model. / language_model.lm_head, the tower's
// vision_tower.encoder.blocks.N.{norm0,norm1,mlp.fc0,mlp.fc1,wo} (one lower than runtime) and
// fused wqkv whose q and k rows interleave the two halves of each rotary pair (transformers'
// PermuteForRope de-interleaves them per head), the projector's proj.0 / proj.2. Runtime-named
// tensors pass unchanged.
Pool normalize_k25(const Pool& in, int64_t heads) {
  Pool out;
  for (const auto& [name, t] : in) {
    std::string n = name;
    auto swap_prefix = [&](const std::string& from, const std::string& to) {
      if (n.rfind(from, 0) != 0) return false;
      n = to + n.substr(from.size());
      return true;
    };
    if (swap_prefix("language_model.model.", "model.language_model.")) {
      n = replace_all(n, "model.language_model.blocks.", "model.language_model.layers.");
    } else if (swap_prefix("language_model.lm_head.", "lm_head.")) {
    } else if (swap_prefix("mm_projector.proj.0.", "model.mm_projector.in_proj.") ||
               swap_prefix("mm_projector.proj.2.", "model.mm_projector.out_proj.")) {
    } else if (n == "vision_tower.patch_embed.pos_emb.weight") {
      n = "model.vision_tower.patch_embed.pos_emb.position_embeddings";
    } else if (swap_prefix("vision_tower.encoder.blocks.", "model.vision_tower.layers.")) {
      n = replace_all(n, ".norm1.", ".norm2.");
      n = replace_all(n, ".norm0.", ".norm1.");
      n = replace_all(n, ".mlp.fc1.", ".mlp.fc2.");
      n = replace_all(n, ".mlp.fc0.", ".mlp.fc1.");
      n = replace_all(n, ".wo.", ".attn.proj.");
      const size_t at = n.find(".wqkv.");
      if (at != std::string::npos && t.shape.ndim() >= 1 && t.shape.dims()[0] % 3 == 0 &&
          t.dtype == DType::F32) {
        const std::string base = n.substr(0, at) + ".attn.", leaf = n.substr(at + 6);
        std::vector<int64_t> d = t.shape.dims();
        const int64_t rows = d[0] / 3, cols = t.shape.numel() / d[0];
        d[0] = rows;
        for (int part = 0; part < 3; ++part) {
          Source src = t;
          src.range = nullptr;  // rows are permuted: read whole (the vision tower is small)
          src.shape = Shape(d);
          src.bytes = t.bytes / 3;
          src.read_into = [t = t, part, rows, cols, heads](Tensor& dst) {
            Tensor all = t.read();
            const float* from = all.f32() + part * rows * cols;
            const int64_t hd = rows / heads, half = hd / 2;
            for (int64_t r = 0; r < rows; ++r) {
              // q and k: runtime row (h, j, i) holds checkpoint row (h, i, j); v as is.
              int64_t r_src = r;
              if (part < 2) {
                const int64_t h = r / hd, j = (r % hd) / half, i = r % half;
                r_src = h * hd + 2 * i + j;
              }
              std::copy_n(from + r_src * cols, cols, dst.f32() + r * cols);
            }
          };
          out[base + "qkv"[part] + "_proj." + leaf] = src;
        }
        continue;
      }
    } else {
      swap_prefix("vision_tower.encoder.", "model.vision_tower.");
    }
    out[n] = t;
  }
  return out;
}

// Checkpoint spellings -> transformers' runtime names. Original kimi_linear checkpoints use
// block_sparse_moe, experts.N.w1/w3/w2 (gate/up/down), self_attn.{A_log,dt_bias,f_a_proj,
// f_b_proj} and separate q/k/v_conv1d; deepseek_v3/v32 checkpoints use per-expert tensors (fused
// later by fuse_experts).
Pool normalize_checkpoint(const std::string& model_type, const Pool& in) {
  if (model_type != "kimi_linear") return in;
  Pool out;
  std::map<std::string, std::array<const Source*, 3>> convs;
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
        convs[n.substr(0, n.size() - leaf.size()) + ".self_attn.conv1d.weight"][i] = &t;
        conv = true;
      }
    }
    if (!conv) out[n] = t;
  }
  for (auto& [name, parts] : convs) {
    bool complete = parts[0] && parts[1] && parts[2] && parts[0]->shape == parts[1]->shape &&
                    parts[0]->shape == parts[2]->shape && parts[0]->shape.ndim() >= 1 &&
                    parts[0]->dtype == DType::F32;
    if (!complete) {  // leave them under their own names: reported as unexpected/missing
      for (int i = 0; i < 3; ++i)
        if (parts[i])
          out[name.substr(0, name.size() - std::strlen("conv1d.weight")) + "qkv"[i] +
              "_conv1d.weight"] = *parts[i];
      continue;
    }
    std::vector<int64_t> d = parts[0]->shape.dims();
    d[0] *= 3;
    std::array<Source, 3> ps{*parts[0], *parts[1], *parts[2]};
    Shape fused(d);
    out[name] = {fused,
                 DType::F32,
                 ps[0].file,
                 3 * ps[0].bytes,
                 [ps](Tensor& dst) {
                   char* at = static_cast<char*>(dst.raw());
                   for (const Source& p : ps) {
                     Tensor part(at, p.shape, DType::F32);
                     p.read_into(part);
                     at += part.bytes();
                   }
                 },
                 [ps](int64_t begin, int64_t count, float* dst) {
                   int64_t o = 0;  // the part's first element in the fused tensor
                   for (const Source& p : ps) {
                     const int64_t n = p.shape.numel();
                     const int64_t lo = std::max(begin, o), hi = std::min(begin + count, o + n);
                     if (lo < hi) p.read_range(lo - o, hi - lo, dst + (lo - begin));
                     o += n;
                   }
                 }};
  }
  return out;
}

// transformers' runtime names -> the spelling its checkpoints use (what save_pretrained writes
// and from_pretrained converts back): per-expert tensors, and kimi's original names.
TensorMap to_checkpoint(const std::string& model_type, const TensorMap& in) {
  const bool kimi = model_type == "kimi_linear";
  // kimi_k25 is written under its runtime names (which transformers loads as they are), with
  // deepseek_v3's per-expert tensors.
  if (!kimi && model_type != "deepseek_v32" && model_type != "deepseek_v3" &&
      model_type != "kimi_k25")
    return in;
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

// Where a group's values go: straight into its parameter when that is one contiguous f32
// tensor (no copy of a whole layer's experts), else into a staging tensor copied afterwards.
Tensor destination(const Group& g) {
  if (g.parts.size() == 1 && g.parts[0]->value.dtype() == DType::F32 &&
      g.parts[0]->value.is_contiguous() && g.parts[0]->value.shape() == g.hf_shape)
    return g.parts[0]->value;
  return Tensor::empty(g.hf_shape);
}

void scatter(const Group& g, const Tensor& src) {
  if (g.parts.size() == 1 && src.raw() == g.parts[0]->value.raw()) return;
  const char* p = static_cast<const char*>(src.raw());
  for (Param* part : g.parts) {
    Tensor view(const_cast<char*>(p), part->value.shape(), DType::F32);
    part->value.copy_from(view);
    p += view.bytes();
  }
}

// Fills the v5 fused expert tensor `dst` ([E, 2F, d] gate_up or [E, d, F] down) from per-expert
// tensors (mlp.experts.N.gate_proj.weight ...), one expert at a time, consuming them from
// `pool`. Returns false when the checkpoint has none.
// `dst` null: names and shapes are checked, nothing is read.
bool fuse_experts(const std::string& prefix, bool gate_up, int64_t E, int64_t F, int64_t d,
                  const Pool& pool, std::set<std::string>& consumed,
                  std::vector<std::string>& problems, Tensor* dst, uint64_t& bytes) {
  if (!pool.count(prefix + "0.gate_proj.weight")) return false;
  for (int64_t e = 0; e < E; ++e) {
    const std::string b = prefix + std::to_string(e) + ".";
    struct Part {
      std::string name;
      Shape shape;
      int64_t offset;  // elements into dst
    };
    std::vector<Part> parts;
    if (gate_up) {
      parts.push_back({b + "gate_proj.weight", {F, d}, e * 2 * F * d});
      parts.push_back({b + "up_proj.weight", {F, d}, (e * 2 + 1) * F * d});
    } else {
      parts.push_back({b + "down_proj.weight", {d, F}, e * d * F});
    }
    for (auto& part : parts) {
      auto it = pool.find(part.name);
      if (it == pool.end()) {
        problems.push_back("missing " + part.name + " " + part.shape.str());
        continue;
      }
      consumed.insert(part.name);
      if (it->second.shape != part.shape || it->second.dtype != DType::F32) {
        problems.push_back("mis-shaped " + part.name + ": file " + it->second.shape.str() +
                           ", expected " + part.shape.str() + in_file(it->second));
        continue;
      }
      if (!dst || !problems.empty()) continue;  // the load fails anyway: only collect problems
      Tensor slice(dst->f32() + part.offset, part.shape, DType::F32);
      it->second.read_into(slice);
      bytes += it->second.bytes;
    }
  }
  return true;
}

// What an import reads, every name and shape checked: each group with its source (null: the
// checkpoint's per-expert tensors, fused by fuse_experts).
struct ImportPlan {
  std::vector<Group> gs;
  Pool pool;
  std::vector<std::pair<const Group*, const Source*>> reads;
  uint64_t total = 0;  // bytes of the checkpoint's tensors (progress)
};

// Checks every name and shape of `raw` against the model before anything is read; every
// missing, unexpected and mis-shaped tensor is reported in one ShapeError.
void plan_import(const Model& m, const std::string& model_type, const Pool& raw,
                 const std::string& source, const ImportOptions& opt, ImportPlan& ip) {
  const ModelConfig& cfg = m.config();
  ip.pool = model_type == "kimi_k25" && cfg.vision ? normalize_k25(raw, cfg.vision->heads)
                                                   : normalize_checkpoint(model_type, raw);
  const Pool& pool = ip.pool;
  std::set<std::string> consumed;
  std::vector<std::string> problems;
  for (const auto& [name, s] : raw) ip.total += s.bytes;
  ip.gs = groups(m, model_type);
  for (const Group& g : ip.gs) {
    bool lora = false;
    for (Param* p : g.parts) lora |= p->spec.role == ParamRole::Lora;
    auto it = pool.find(g.hf_name);
    if (lora && opt.keep_lora && it == pool.end()) continue;
    if (it != pool.end()) {
      consumed.insert(g.hf_name);
      if (it->second.shape != g.hf_shape || it->second.dtype != DType::F32) {
        problems.push_back("mis-shaped " + g.hf_name + ": file " + it->second.shape.str() + " " +
                           std::string(dtype_name(it->second.dtype)) + ", expected " +
                           g.hf_shape.str() + in_file(it->second));
        continue;
      }
      ip.reads.emplace_back(&g, &it->second);
      continue;
    }
    const bool gate_up = ends_with(g.hf_name, ".mlp.experts.gate_up_proj");
    if (gate_up || ends_with(g.hf_name, ".mlp.experts.down_proj")) {
      const std::string base = g.hf_name.substr(0, g.hf_name.rfind('.') + 1);
      uint64_t none = 0;
      if (fuse_experts(base, gate_up, cfg.moe.num_experts, cfg.moe.expert_ffn, cfg.moe.latent, pool,
                       consumed, problems, nullptr, none)) {
        ip.reads.emplace_back(&g, nullptr);  // per-expert tensors, fused when read
        continue;
      }
    }
    if (g.hf_name == "lm_head.weight" && cfg.tie_embeddings) continue;
    problems.push_back("missing " + g.hf_name + " " + g.hf_shape.str());
  }
  const int64_t n_layers = static_cast<int64_t>(cfg.layers.size());
  for (const auto& [name, t] : pool) {
    if (consumed.count(name)) continue;
    if (layer_of(name) >= n_layers) continue;              // multi-token-prediction layers
    if (ends_with(name, "rotary_emb.inv_freq")) continue;  // a derived buffer in old checkpoints
    // transformers keeps zero-width modules (e.g. shared experts with n_shared_experts = 0);
    // they hold no values, and the engine simply has no such parameter.
    if (t.shape.numel() == 0) continue;
    if (name == "lm_head.weight" && cfg.tie_embeddings) continue;
    problems.push_back("unexpected " + name + " " + t.shape.str() + in_file(t));
  }
  if (problems.empty()) return;
  // Per-expert problems are found once per fused tensor (gate_up and down); report each once.
  std::sort(problems.begin(), problems.end());
  problems.erase(std::unique(problems.begin(), problems.end()), problems.end());
  // One line, so that the command's error is one line however many tensors are wrong.
  std::string msg = source + ": " + std::to_string(problems.size()) + " tensor problem(s): ";
  const size_t shown = std::min<size_t>(problems.size(), 8);
  for (size_t i = 0; i < shown; ++i) msg += (i ? "; " : "") + problems[i];
  if (shown < problems.size()) msg += cat("; and ", problems.size() - shown, " more");
  MT_THROW(ShapeError, msg);
}

void import_pool(Model& m, const std::string& model_type, const Pool& raw,
                 const std::string& source, const ImportOptions& opt) {
  ImportPlan ip;
  plan_import(m, model_type, raw, source, opt, ip);
  const ModelConfig& cfg = m.config();
  uint64_t done = 0;
  for (const auto& [g, src] : ip.reads) {
    Tensor dst = destination(*g);
    if (src) {
      src->read_into(dst);
      done += src->bytes;
    } else {
      std::set<std::string> consumed;
      std::vector<std::string> problems;
      fuse_experts(g->hf_name.substr(0, g->hf_name.rfind('.') + 1),
                   ends_with(g->hf_name, "gate_up_proj"), cfg.moe.num_experts, cfg.moe.expert_ffn,
                   cfg.moe.latent, ip.pool, consumed, problems, &dst, done);
      MT_CHECK(problems.empty(), InternalError, source, ": ", problems.front(),
               " after the plan was checked");
    }
    scatter(*g, dst);
    if (opt.progress) opt.progress(done, ip.total);
  }
}

// Adapters are not part of an HF checkpoint (PEFT writes them: write_peft_adapter); gradients
// exist for trainable non-buffer parameters only.
bool exported(const Group& g, bool grads) {
  for (Param* p : g.parts)
    if (grads ? (!p->trainable() || p->spec.role == ParamRole::Buffer)
              : p->spec.role == ParamRole::Lora)
      return false;
  return true;
}

// One group's f32 tensor under its transformers runtime name; `values` (optional) gives the
// parameters' values in place of their own.
Tensor export_group(const Group& g, bool grads, const ParamValues& values = {}) {
  if (values && g.parts.size() == 1) return values(*g.parts[0]).view(g.hf_shape);
  Tensor t = Tensor::empty(g.hf_shape);
  char* dst = static_cast<char*>(t.raw());
  for (Param* p : g.parts) {
    Tensor f;
    if (values) {
      f = values(*p);
    } else {
      const Tensor& src = grads ? p->grad : p->value;
      f = Tensor::empty(src.shape());
      f.copy_from(src);
    }
    std::memcpy(dst, f.raw(), f.bytes());
    dst += f.bytes();
  }
  return t;
}

}  // namespace

TensorMap export_hf_tensors(const Model& m, const std::string& model_type, bool grads) {
  TensorMap out;
  for (const Group& g : groups(m, model_type))
    if (exported(g, grads)) out.emplace(g.hf_name, export_group(g, grads));
  return out;
}

void import_hf_tensors(Model& m, const std::string& model_type, const TensorMap& tensors,
                       const std::string& source, const ImportOptions& opt) {
  import_pool(m, model_type, pool_of(tensors), source, opt);
}

void import_hf_tensors(Model& m, const std::string& model_type, const SafetensorsModel& st,
                       const std::string& source, const ImportOptions& opt) {
  import_pool(m, model_type, pool_of(st), source, opt);
}

struct HfSliceReader::Impl {
  ImportPlan ip;
  struct Slot {
    const Group* group = nullptr;
    const Source* src = nullptr;  // null: per-expert tensors
    int64_t offset = 0;           // the parameter's first element in its group's HF tensor
  };
  std::map<std::string, Slot> slots;
  int64_t E = 0, F = 0, d = 0;
  uint64_t elements = 0;

  // Elements [begin, begin + count) of a fused expert tensor (gate_up [E, 2F, d] or down
  // [E, d, F]) from the checkpoint's per-expert tensors, each of them read only where it
  // overlaps.
  void read_experts(const Group& g, int64_t begin, int64_t count, float* out) const {
    const bool gate_up = ends_with(g.hf_name, "gate_up_proj");
    const std::string base = g.hf_name.substr(0, g.hf_name.rfind('.') + 1);
    const int64_t part = F * d;  // one gate, up or down matrix
    for (int64_t at = begin; at < begin + count;) {
      const int64_t k = at / part, end = std::min(begin + count, (k + 1) * part);
      const int64_t e = gate_up ? k / 2 : k;
      const char* leaf = !gate_up ? "down_proj.weight"
                         : k % 2  ? "up_proj.weight"
                                  : "gate_proj.weight";
      ip.pool.at(base + std::to_string(e) + "." + leaf)
          .read_range(at - k * part, end - at, out + (at - begin));
      at = end;
    }
  }
};

HfSliceReader::HfSliceReader(const Model& m, const std::string& model_type,
                             const SafetensorsModel& st, const std::string& source,
                             const ImportOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  plan_import(m, model_type, pool_of(st), source, opt, impl_->ip);
  for (const auto& [g, src] : impl_->ip.reads) {
    int64_t offset = 0;
    for (const Param* p : g->parts) {
      impl_->slots[p->name] = {g, src, offset};
      offset += p->spec.shape.numel();
    }
  }
  impl_->E = m.config().moe.num_experts;
  impl_->F = m.config().moe.expert_ffn;
  impl_->d = m.config().moe.latent;
}

HfSliceReader::~HfSliceReader() = default;

bool HfSliceReader::read(const Param& p, int64_t begin, int64_t end, float* out) const {
  const auto it = impl_->slots.find(p.name);
  if (it == impl_->slots.end()) return false;
  MT_CHECK(0 <= begin && begin <= end && end <= p.spec.shape.numel(), ShapeError, "parameter ",
           p.name, " ", p.spec.shape, ": elements [", begin, ", ", end, ") out of range");
  const Impl::Slot& s = it->second;
  const int64_t b = s.offset + begin, n = end - begin;
  if (s.src)
    s.src->read_range(b, n, out);
  else
    impl_->read_experts(*s.group, b, n, out);
  impl_->elements += static_cast<uint64_t>(n);
  return true;
}

uint64_t HfSliceReader::elements_read() const {
  return impl_->elements;
}

Fp8Blocks fp8_blocks(const HfConfig& cfg) {
  Fp8Blocks b;
  if (cfg.fp8_block_rows > 0) b = {cfg.fp8_block_rows, cfg.fp8_block_cols};
  return b;
}

LoadedModel load_hf_model(const std::string& dir, const ModelOptions& opt,
                          const ProgressFn& progress) {
  LoadedModel lm;
  lm.config = load_hf_config(dir);
  // Headers first: a missing or truncated shard fails before the model is allocated.
  SafetensorsModel st(dir, fp8_blocks(lm.config));
  lm.model = std::make_unique<Model>(lm.config.model, /*seed=*/0, opt);
  import_hf_tensors(*lm.model, lm.config.model_type, st, dir, {.progress = progress});
  return lm;
}

std::string hf_runtime_name(const std::string& model_type, const std::string& engine_name) {
  if (model_type == "kimi_k25") return k25_runtime_name(engine_name);
  return model_type == "kimi_linear" ? forget_gate_name(engine_name) : engine_name;
}

HfConfig load_model_config(const std::string& name_or_path) {
  for (const std::string& p : preset_names())
    if (p == name_or_path) return hybrid_hf_config(ModelConfig::load(name_or_path));
  return load_hf_config(name_or_path);
}

bool has_weights(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.path().extension() == ".safetensors") return true;
  return false;
}

ProgressFn progress_printer(std::ostream& os, const std::string& label, bool tty) {
  struct State {
    int last = -1;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  };
  auto st = std::make_shared<State>();
  return [&os, label, tty, st](uint64_t done, uint64_t total) {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    const int step = tty ? pct : pct / 25 * 25;
    if (step == st->last) return;
    st->last = step;
    char sizes[64];
    const bool gb = total >= 1000000000;
    const double unit = gb ? 1e9 : 1e6;
    std::snprintf(sizes, sizeof sizes, "%.2f/%.2f %s", static_cast<double>(done) / unit,
                  static_cast<double>(total) / unit, gb ? "GB" : "MB");
    if (tty) {
      // Rate and time left from the mean since the first call: reads of one model run at one
      // speed (the disk's or the decoder's), so the mean is the forecast.
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - st->start).count();
      const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
      char speed[64] = "";
      if (rate > 0 && done < total) {
        const auto left = static_cast<int64_t>(static_cast<double>(total - done) / rate + 0.5);
        std::snprintf(speed, sizeof speed, " %.1f MB/s ETA %lld:%02lld", rate / 1e6,
                      static_cast<long long>(left / 60), static_cast<long long>(left % 60));
      } else if (rate > 0) {
        std::snprintf(speed, sizeof speed, " %.1f MB/s in %.1f s", rate / 1e6, secs);
      }
      const int w = 30, fill = pct * w / 100;
      os << "\rloading " << label << " [" << std::string(static_cast<size_t>(fill), '#')
         << std::string(static_cast<size_t>(w - fill), ' ') << "] " << pct << "% " << sizes << speed
         << "\033[K" << (done >= total ? "\n" : "") << std::flush;
    } else {
      os << "loading " << label << ": " << step << "% " << sizes << "\n";
    }
  };
}

HfConfig hybrid_hf_config(const ModelConfig& cfg) {
  HfConfig h;
  h.model = cfg;
  h.model_type = cfg.model_type;
  h.raw = cfg.to_json();
  return h;
}

void save_hf_model(const Model& m, const HfConfig& cfg, const std::string& dir,
                   uint64_t max_shard_bytes, const ParamValues& values) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MT_CHECK(!ec, IoError, dir, ": cannot create directory: ", ec.message());
  // Streamed: one parameter group converted and written at a time (an export at model size
  // holds the model once, not twice).
  std::vector<Group> gs;
  for (Group& g : groups(m, cfg.model_type))
    if (exported(g, false) && !(cfg.model.tie_embeddings && g.hf_name == "lm_head.weight"))
      gs.push_back(std::move(g));
  write_safetensors_streamed(
      dir, gs.size(),
      [&](size_t u) {
        TensorMap one =
            to_checkpoint(cfg.model_type, {{gs[u].hf_name, export_group(gs[u], false, values)}});
        return std::vector<std::pair<std::string, Tensor>>(std::make_move_iterator(one.begin()),
                                                           std::make_move_iterator(one.end()));
      },
      {{"format", "pt"}}, max_shard_bytes);
  // config.json last, through a temporary name, so a directory with a config is complete.
  fs::path final_path = fs::path(dir) / "config.json";
  fs::path tmp = final_path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp);
    nlohmann::json raw = cfg.raw;
    // The weights are written dequantised: a kept quantization_config would make transformers
    // read them as FP8.
    raw.erase("quantization_config");
    f << raw.dump(2) << "\n";
    f.flush();
    MT_CHECK(f.good(), IoError, tmp.string(), ": write failed");
  }
  fs::rename(tmp, final_path, ec);
  MT_CHECK(!ec, IoError, final_path.string(), ": rename failed: ", ec.message());
}

}  // namespace mt
