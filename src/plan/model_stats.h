// Counts, bytes and FLOPs of a model, derived from the IR through the layers' own param_specs and
// plan_activations (the code the engine allocates with), so a prediction cannot drift from what
// a built model holds. Nothing here allocates model memory: seed-2.8t is sized from specs alone.
#pragma once

#include "core/device.h"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "plan/plan_ir.h"

namespace mt::plan {

// LoRA applied to every projection (and, with expert_rank > 0, to every routed expert).
struct LoraOptions {
  int64_t rank = 0;  // 0: full fine-tuning
  float alpha = 16.f;
  int64_t expert_rank = 0;
};
// The config with the adapters switched on (mla and dsa.mla both: DSA layers read dsa.mla).
ModelConfig with_lora(ModelConfig cfg, const LoraOptions& lora);

enum class Component {
  Embedding,
  LmHead,
  Norms,  // block and final RMSNorms
  Kda,
  MlaAttention,  // dense MLA layers
  DsaAttention,  // the MLA half of DSA layers
  Indexer,
  Router,
  Latent,  // latent down/up projections of the MoE
  SharedExperts,
  DenseFfn,
  RoutedExperts,
  Lora,        // adapters on projections
  ExpertLora,  // adapters on routed experts
  Vision,      // kimi_k25's vision tower and projector (their adapters included)
  Count
};
constexpr size_t kComponents = static_cast<size_t>(Component::Count);
const char* component_name(Component c);

// Which component a parameter (full HF name) belongs to.
Component classify(const ModelConfig& cfg, const NamedSpec& s);
// Whether Model(cfg, seed, {.freeze_base}) gives the parameter a gradient.
bool is_trainable(const ParamSpec& s, bool freeze_base);
// Parameters split across EP ranks (routed experts and their adapters).
bool is_expert(const NamedSpec& s);

struct ComponentCount {
  int64_t params = 0;
  int64_t trainable = 0;
};
struct ParamCounts {
  std::array<ComponentCount, kComponents> by_component{};
  int64_t total = 0, trainable = 0;
  int64_t expert = 0, expert_trainable = 0;  // subset held by EP ranks
  int64_t buffers = 0;                       // non-trainable buffers (router bias): never sharded
  int64_t trainable_fp32 = 0;    // trainable but stored fp32 under a narrower policy: no master
  int64_t active_per_token = 0;  // parameters a token touches (top_k of the routed experts)
  // FSDP units: the largest non-expert unit (a block, the embedding or the head) and the routed
  // experts of one MoE layer, all of them (a rank holds its share).
  int64_t largest_unit = 0, largest_unit_trainable = 0;
  int64_t expert_layer = 0, expert_layer_trainable = 0;
  // Stored bytes of the values under `precision` (each parameter in its own dtype, param_dtype):
  // all of them, the expert subset, the buffers, and the largest units as above.
  int64_t weight_bytes = 0, expert_bytes = 0, buffer_bytes = 0;
  int64_t largest_unit_bytes = 0, expert_layer_bytes = 0;
  Precision precision;  // the policy the byte counts are for
  const ComponentCount& operator[](Component c) const {
    return by_component[static_cast<size_t>(c)];
  }
};
ParamCounts count_params(const ModelConfig& cfg, bool freeze_base,
                         const Precision& precision = Precision::fp32());

// Bytes per element of each kind of state under a policy, for the estimated terms (buffers,
// traffic); the exact terms count every parameter and activation in its own dtype.
struct BytesPerElement {
  double weight, grad, master, optim, act;
};
BytesPerElement bytes_per_element(const Precision& p);

// Activation bytes one block keeps, from the layers' plan_activations.
struct BlockActs {
  MixerKind mixer;
  FfnKind ffn;
  size_t boundary = 0;  // norms, residuals and outputs the model itself keeps around the block
  size_t mixer_bytes = 0;
  size_t ffn_bytes = 0;
  size_t input = 0;                // the block input (what Full recompute keeps)
  DType activations = DType::F32;  // the plan's activation dtype
  size_t saved(Recompute r) const;
  size_t all() const { return boundary + mixer_bytes + ffn_bytes; }
};
// Per block, activations stored as `activations` (fp32 entries stay fp32), for mbs documents of
// seq tokens packed together, in an arena on `device` (layers may keep more there for its kernels).
std::vector<BlockActs> block_activations(const ModelConfig& cfg, int64_t mbs, int64_t seq,
                                         DType activations = DType::F32,
                                         Device device = Device::CPU);

struct MemoryBreakdown {
  double weights = 0, grads = 0, master = 0, optimizer = 0;
  double activations = 0;
  double fsdp_buffers = 0;    // gathered layer (+ prefetch) and gradient reduce-scatter buffer
  double expert_buffers = 0;  // gathered expert layer when experts are sharded across replicas
  double a2a_buffers = 0;     // dispatch/combine send and receive buffers
  double workspace = 0;       // backward scratch, cross-entropy chunk, residual gradients
  double total() const {
    return weights + grads + master + optimizer + activations + fsdp_buffers + expert_buffers +
           a2a_buffers + workspace;
  }
  nlohmann::json to_json() const;
};

struct MemoryOptions {
  Precision precision = Precision::bf16();  // what the GPU runs; the CPU engine runs fp32
  bool freeze_base = true;
  double a2a_capacity = 1.25;  // receive headroom over the balanced share (routing skew)
  int64_t ce_chunk = 0;        // tokens per cross-entropy chunk; 0: the model's for `device`
  int threads = 1;             // CPU threads of the step: the KDA core's scratch is per thread
  // Where the step runs: the ops' scratch differs (the CUDA chunked KDA keeps its per-chunk
  // products for the whole layer, the CPU's per-thread buffers only a chunk).
  Device device = Device::CPU;
};

// Peak bytes per device for `cfg` under `p`. With world = 1 and fp32 this is what one CPU training
// step (forward, backward, AdamW) allocates; weights, gradients, masters, optimizer state and
// activations are exact under every policy (the model builds the same store and plan, a test
// checks both), the workspace and step buffers are estimates scaled by the activation dtype.
MemoryBreakdown predict_memory(const ModelConfig& cfg, const ParallelPlan& p,
                               const MemoryOptions& o);
// As above with counts and block activations already computed (the search calls it per plan);
// both must be for o.precision (ValueError otherwise).
MemoryBreakdown predict_memory(const ModelConfig& cfg, const ParamCounts& counts,
                               const std::vector<BlockActs>& acts, const ParallelPlan& p,
                               const MemoryOptions& o);

// FLOPs per token, split by where they run (each kind has its own calibrated rate).
struct Flops {
  double dense_gemm = 0;   // projections, shared experts, dense FFN, router, LM head
  double expert_gemm = 0;  // routed experts (grouped GEMM)
  double kda_core = 0;     // chunked delta rule
  double attn_dense = 0;   // dense causal MLA core
  double attn_sparse = 0;  // DSA attention over the top-k positions
  double indexer = 0;      // lightning indexer scores over all previous positions
  double total() const {
    return dense_gemm + expert_gemm + kda_core + attn_dense + attn_sparse + indexer;
  }
  Flops& operator+=(const Flops& o);
  Flops scaled(double s) const;
  nlohmann::json to_json() const;
};
struct StepFlops {
  Flops forward;    // per token, one forward
  Flops train;      // per token, forward + backward (no wgrad for frozen weights)
  Flops recompute;  // per token, extra forward work the recompute policy adds
};
StepFlops flops_per_token(const ModelConfig& cfg, int64_t seq, bool freeze_base, Recompute r);

}  // namespace mt::plan
