// The hybrid decoder: embedding, pre-norm blocks (mixer = KDA | gated DSA | MLA, then FFN =
// dense SwiGLU | latent MoE, each with a residual), final RMSNorm, LM head fused with the
// chunked cross-entropy. Forward keeps activations in one arena sized from the same plan the
// planner reads (activation_bytes); backward adds every trainable parameter's gradient.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/context.h"
#include "core/seq_info.h"
#include "model/layer.h"
#include "model/model_config.h"
#include "model/param_store.h"
#include "model/precision.h"
#include "ops/grouped_matmul.h"

namespace mt {

class MoeLayer;
class ExpertCompute;
class VisionFrontEnd;
struct ImageBatch;

// Per-unit callbacks around Model::forward/backward, for sharded (FSDP) parameters. Units are
// 0 = embedding, 1 + i = layer i (both norms, mixer, FFN), num_layers() + 1 = the head (final
// norm, LM head). A hook may replace the unit's Param values/grads in the store and call
// Model::rebind_unit before the unit computes; the model never touches a unit's parameters
// outside its before/after window. Without hooks the model runs exactly as before.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(int unit) = 0;
  virtual void after_forward(int unit) = 0;
  virtual void before_backward(int unit) = 0;
  virtual void after_backward(int unit) = 0;
};

// What forward keeps for backward. None: every layer's activations. Selective: everything but
// the FFN's (dense or MoE) saved tensors, which are the bulk of a MoE block's activations but the
// cheapest part to recompute (GEMMs, where the mixer would replay the KDA / attention cores);
// backward replays layer i's FFN into a scratch arena sized for one FFN plus its output. Full:
// only each layer's input (the residual stream); backward replays layer i's forward into a
// scratch arena sized for one layer (the largest plan_activations) just before its backward.
enum class ActivationRecompute { None, Selective, Full };

// Per-layer kernel choice made at build time by the caller (the kernel registry,
// src/plan/kernels.h, consulted by the trainer): model/ knows no kernel names, so the choice
// arrives as the implementations the layers can switch between, plus the record of every op's
// kernel for the log.
enum class KdaImpl { Chunked, Recurrent };
struct OpKernel {
  std::string op, kernel;
  bool reference = false;  // the always-correct fallback
  std::string why;         // why a faster kernel was rejected (empty when none was)
};
struct LayerKernels {
  KdaImpl kda = KdaImpl::Chunked;  // KDA layers: overrides the config's kda.chunked
  std::vector<OpKernel> ops;
};

struct ModelOptions {
  // Train only LoRA adapters: base weights get no gradient buffer and no optimizer state.
  bool freeze_base = false;
  // With freeze_base: base parameters (by full HF name) that still train in full, e.g. a router.
  std::function<bool(const std::string&)> also_train;
  ActivationRecompute recompute = ActivationRecompute::None;
  // Empty: every layer as its config says. Else one entry per layer.
  std::vector<LayerKernels> kernels;
  // Storage dtypes of parameters and activations (model/precision.h). The store, the activation
  // plan and the planner follow it; the CPU ops compute in fp32 only, so forward refuses any
  // other policy on the CPU (a bf16 model can still be built, planned and checkpointed).
  Precision precision = Precision::fp32();
  // Where parameters, gradients and activations live; forward and backward take a context on
  // the same device.
  Device device = Device::CPU;
  // ParamStore::set_tiled_init: for speed benchmarks of large models only.
  bool tiled_init = false;
  // Under a mesh whose ranks load their slices from a file (par::DistTrainer::load_pieces): the
  // base weights get no memory here (ParamStore::set_deferred), so no rank ever holds the whole
  // model; shard_experts and the FSDP units allocate only their slices, and the model must not
  // run before they are filled.
  bool defer_weights = false;
  // The routed experts' grouped GEMM configuration (MoeLayer::set_grouped_gemm); unset: the
  // environment's (MOETRAIN_GROUPED_GEMM) or the default.
  std::optional<ops::GroupedGemmConfig> grouped_gemm;
};

// One parameter of a model as declared, without allocating it (for counting and planning).
struct NamedSpec {
  std::string name;  // full HF name
  ParamSpec spec;    // spec.dtype: its storage under the policy
};
std::vector<NamedSpec> model_param_specs(const ModelConfig& cfg,
                                         const Precision& precision = Precision::fp32());

std::unique_ptr<Layer> make_mixer(const ModelConfig& cfg, MixerKind kind);
std::unique_ptr<Layer> make_ffn(const ModelConfig& cfg, FfnKind kind);

class Model {
 public:
  Model(const ModelConfig& cfg, uint64_t seed, const ModelOptions& opt = {});
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  int num_layers() const { return static_cast<int>(mixers_.size()); }
  Layer& mixer(int i) { return *mixers_.at(static_cast<size_t>(i)); }
  Layer& ffn(int i) { return *ffns_.at(static_cast<size_t>(i)); }
  // The kernels each layer was built with (empty when the options named none).
  const std::vector<LayerKernels>& kernels() const { return kernels_; }
  const Precision& precision() const { return precision_; }

  // Bytes of activation memory for one step over `seq`: the arena forward keeps, plus with
  // recompute the scratch arena one layer's replay uses.
  size_t activation_bytes(const SeqInfo& seq) const;
  // Bytes the last forward's micro-batch and the replays since took from them (equal to the
  // plan: a test checks it).
  size_t activation_bytes_used() const;
  ActivationRecompute recompute() const { return recompute_; }
  // Takes effect at the next forward.
  void set_recompute(ActivationRecompute r) { recompute_ = r; }

  // ids, targets: i32 [tokens] (targets may hold ignore_index = -100). Returns the mean
  // cross-entropy over non-ignored targets; activations stay alive until backward(). The op
  // writes the loss into loss() (f64 [1], on the device); the return value reads it, the one
  // synchronisation point of a forward (docs/gpu.md).
  // `slot` names the micro-batch: each slot owns its activation arena and every layer's state
  // (Layer::make_state), made by its first forward and reused after, so forwards of several
  // slots may be in flight before their backwards, in any order. backward(ctx, slot) consumes
  // the slot's forward. The recompute scratch arena is shared: a replay fills it just before the
  // backward that reads it.
  // `pass`: Train when backward(ctx, slot) follows: a frozen LM head then computes its input
  // gradient with the loss (the logits are formed once per step instead of twice), and DSA
  // layers form their indexer KL in backward (from the attention backward's probabilities), so
  // that aux_losses() holds it once backward has run; after a Loss forward it holds it at once.
  // Eval: no backward follows (an evaluation); layers may skip what only backward reads (KDA's
  // chunk states on the GPU), and backward(ctx, slot) then refuses the slot.
  enum class Pass { Loss, Train, Eval };
  double forward(Context& ctx, const SeqInfo& seq, const Tensor& ids, const Tensor& targets,
                 int slot = 0, Pass pass = Pass::Loss);
  const Tensor& loss() const { return loss_; }
  // Images of the next forwards (not owned; null = none), for models with a vision tower: their
  // rows replace the embeddings of the image placeholder tokens in `ids`.
  void set_images(const ImageBatch* images) { images_ = images; }
  // Adds d(loss)/d(param) into every trainable gradient (cross-entropy, plus each layer's own
  // auxiliary losses with their weights).
  void backward(Context& ctx, int slot = 0);
  // Multiplies backward's gradient of the cross-entropy (a mean over targets) and of the MoE
  // sequence aux loss (a mean over documents). Data parallelism weights each rank's means by its
  // share of the global targets / documents, so that the sum over ranks is the gradient of the
  // global means. 1 on one process.
  void set_loss_weight(float ce, float seq_aux = 1.f);
  // Final-norm hidden states [tokens, hidden] of the last forward, for callers that need the
  // logits themselves (the loss path never materialises them).
  const Tensor& final_hidden() const;
  // Auxiliary losses of the last forward (a DSA layer's KL after a Train forward: once its
  // backward has run), summed by name over layers: reads every layer's
  // AuxTerm tensors (a synchronisation point; the trainer calls it once, after the step). The
  // result lives in the model and is refilled in place, so a step's read allocates nothing.
  const std::vector<AuxLoss>& aux_losses() const;

  // The MoE layers (null entries for dense-FFN layers), for expert parallelism and load stats.
  std::vector<MoeLayer*> moe_layers();
  // Expert parallelism: keeps only experts [first, first + count) of every MoE layer (values as
  // initialised, so every rank's slice equals the single-process model's), frees the rest and
  // rebinds the layers; computes[i] (one per MoE layer, not owned) runs layer i's experts.
  // Deferred weights (ModelOptions::defer_weights) become zero-filled slices, for a loader.
  void shard_experts(int64_t first, int64_t count, const std::vector<ExpertCompute*>& computes);

  // Deferred weights (ModelOptions::defer_weights) for which `whole` holds get zero-filled
  // values (and zeroed gradients) of their full shape, and every layer is rebound: a mesh calls
  // it for what it keeps whole before it slices the rest.
  void materialize_deferred(const std::function<bool(const Param&)>& whole);

  // Moves every parameter and gradient to `device` and rebinds the layers (a model is built and
  // loaded on the host, then moved; checkpoints read and write through host copies).
  void to_device(Device device);

  // Per-unit hooks (not owned; null = none).
  void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }
  int num_units() const { return num_layers() + 2; }
  // Full HF-name prefixes whose parameters belong to unit u (see UnitHooks).
  std::vector<std::string> unit_prefixes(int unit) const;
  // Whether unit u's backward reads its parameter values (the embedding's only scatters
  // gradients, so a sharded embedding need not be gathered again for it).
  bool unit_backward_reads_values(int unit) const { return unit != 0; }
  // Re-reads unit u's parameters (value and grad tensors) from the store and binds them.
  void rebind_unit(int unit);
  // How many times rebind_unit(unit) ran: a hook that binds a unit once to views that stay valid
  // across steps (Fsdp) rebinds it only after someone else did, since binding allocates.
  int64_t unit_binds(int unit) const {
    return unit_binds_.empty() ? 0 : unit_binds_.at(static_cast<size_t>(unit));
  }

 private:
  // Moves layer i's frozen routed expert base weights into the padded buffers of the
  // K-concatenation path when its MoE layer runs it (MoeLayer::pads_expert_weights,
  // ops/grouped_ffn.h): the store's value becomes the view of the W block and the old storage
  // goes. True when a value moved.
  bool pad_experts(size_t layer);
  // What one forward keeps for its backward: the micro-batch's arena, its residual stream and
  // norms, every layer's state and the vision front end's.
  struct MicroBatch {
    Arena acts;
    SeqInfo seq;
    Tensor ids, targets;
    std::vector<Tensor> resid, normed_in, rstd_in, mid, normed_post, rstd_post;
    Tensor final_h, final_rstd, lse;
    // d(loss)/d(final_h) for head_dloss (the loss weight then), when head_dh_valid: a Train
    // forward of a frozen head. Its room is taken by every forward, so that the arena's use
    // equals its plan whichever the pass.
    Tensor head_dh;
    float head_dloss = 0.f;
    bool head_dh_valid = false;
    std::vector<std::unique_ptr<LayerState>> mixer, ffn;
    std::unique_ptr<LayerState> vision;  // with a vision tower only
    bool have_forward = false;
    bool eval_forward = false;  // the last forward was a Pass::Eval one
  };
  MicroBatch& micro_batch(int slot);
  void plan(const SeqInfo& seq, ArenaPlan& p) const;
  // One layer's activations, in allocation order, including its output (the next residual).
  void plan_layer(size_t i, const SeqInfo& seq, ArenaPlan& p) const;
  size_t scratch_bytes(const SeqInfo& seq) const;
  // Block i: norms, mixer and FFN with their residuals, from resid_[i] into `out`, saving
  // everything backward needs in `la`.
  // The FFN's saved tensors go to `fa` (== la unless recompute is Selective).
  void layer_forward(Context& ctx, MicroBatch& mb, size_t i, Arena& la, Arena& fa, Tensor& out);
  // Replays FFN i from the kept normed input into the scratch arena (recompute = Selective).
  void replay_ffn(Context& ctx, MicroBatch& mb, size_t i);

  ModelConfig cfg_;
  ParamStore params_;
  ParamRef embed_, lm_head_, final_norm_;
  // Whether the head trains, fixed at construction (FSDP binds its gradient in backward only).
  bool head_trains_ = false;
  std::vector<ParamRef> norm_in_, norm_post_;
  std::vector<std::unique_ptr<Layer>> mixers_, ffns_;
  std::vector<LayerKernels> kernels_;
  Precision precision_;

  std::vector<std::unique_ptr<MicroBatch>> slots_;  // by slot; made by a slot's first forward
  int last_slot_ = 0;                               // of the last forward (readouts)
  Arena scratch_;  // one layer's (Full) or one FFN's (Selective) replay
  ActivationRecompute recompute_ = ActivationRecompute::None;
  Tensor loss_;                            // f64 [1], written by the cross-entropy op
  mutable std::vector<AuxLoss> aux_read_;  // aux_losses()' result, refilled in place
  float loss_weight_ = 1.f;
  UnitHooks* hooks_ = nullptr;
  std::vector<int64_t> unit_binds_;  // by unit, see unit_binds()
  std::unique_ptr<VisionFrontEnd> vision_;
  const ImageBatch* images_ = nullptr;
};

}  // namespace mt
