// One data-parallel training step over a mesh: every rank runs forward/backward on its own
// documents (experts reached through ExpertParallel), then
//   dense units (embedding, each layer, the head): flat gradient buffers reduce-scattered over the
//     world, AdamW on this rank's flat shard (moments exist for the shard only), parameters
//     all-gathered back;
//   local experts: gradients summed over the EDP replicas (all-reduce, or reduce-scatter with
//     shard_experts), AdamW on the local experts (or their shard);
//   gradient clipping on the global norm (each element counted once across the world);
//   aux-loss-free router bias from expert loads all-reduced over the world.
// With the documents split over the ranks, this is the single-process step on all of them: each
// rank's cross-entropy gradient is weighted by world * (its targets / all targets) and every
// gradient is scaled by 1 / world, so the sum is the gradient of the global token mean.
//
// The step runs where the model lives: host memory over MPI, or a GPU with an NCCL communicator
// (parallel/nccl_comm.h), with the same code: buffers are tensors on the model's device, data
// moves through Comm calls and ops on the context's stream, and only the counts, the layouts and
// a few scalars (the norm, the loss, the balance check) are host values (docs/parallelism.md).
//
// With DistOptions::fsdp the dense units are FSDP units (parallel/fsdp.h): each rank keeps only
// its flat shards of values, gradients and moments; values are gathered per unit around its
// forward and backward and gradients reduce-scattered as each unit's backward ends. Without it,
// ranks keep full dense parameters and reduce the gradients in buckets (DistOptions::bucket_mib),
// each posted during backward as soon as the units in it are done.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/context.h"
#include "core/seq_info.h"
#include "model/model.h"
#include "ops/optim.h"
#include "parallel/comm.h"
#include "parallel/expert_parallel.h"
#include "parallel/mesh.h"

namespace mt::par {

struct DistOptions {
  int a2a_chunks = 1;
  ops::AdamWOptions adam;
  // ZeRO-3 units for the dense parameters (tied embeddings: ConfigError).
  bool fsdp = false;
  // ZeRO-3 for the routed experts over the EDP group: each replica keeps 1/replicas of its local
  // experts' values, gradients and moments; a layer's experts are gathered with its unit
  // (forward, and backward, where recompute replays them), prefetched with the next unit,
  // freed after use, and their gradients reduce-scattered over the group (parallel/fsdp.h).
  bool shard_expert_weights = false;
  // Route the experts through ExpertParallel's exchange even when the EP group is one rank (where
  // it is a copy): a world of one then runs the dispatch code path of a larger mesh (tests).
  bool exchange_at_ep1 = false;
  // Gradient buckets without FSDP (dist_unit.h, DistTrainer::Bucket): units whose gradients are
  // final are reduced together in collectives of about this size, posted during backward.
  double bucket_mib = 25;
  // Micro-batches per optimizer step (gradient accumulation): the buckets are posted in the last
  // one's backward. A caller running more keeps correct results: the early reductions are
  // redone after backward (the reduction is then not overlapped).
  int micro_batches = 1;
};

// Bytes one rank holds for training (activations excluded: they do not depend on the mesh).
struct MemoryReport {
  int64_t params = 0;     // persistent values: dense shards (fsdp) or tensors, local experts
  int64_t grads = 0;      // persistent gradient buffers
  int64_t optimizer = 0;  // AdamW moments
  int64_t transient = 0;  // peak of step buffers: gathers, unit gradients, flat reductions
  // fsdp / shard_expert_weights only: the value shards (part of params; the experts' part of
  // them) and Fsdp's step buffers (unit gathers, unit gradients; part of transient).
  int64_t fsdp_shards = 0, expert_shards = 0, fsdp_buffers = 0;
  int fsdp_units_peak = 0, fsdp_grads_peak = 0;  // see FsdpMemory
  int64_t total() const { return params + grads + optimizer + transient; }
};

struct StepResult {
  double loss = 0;       // mean cross-entropy over all ranks' tokens
  double grad_norm = 0;  // global, before clipping
};

// What one rank did in one step (reset by each step()).
struct StepMetrics {
  CommStats world, ep, edp;
  int64_t rows_received = 0;  // token-expert pairs this rank's experts computed
  double comm_seconds() const;
  double idle_seconds() const;
  double device_seconds() const;     // CollectiveStats::device_seconds of the three groups
  std::string line(int rank) const;  // one human-readable line per rank
};

// Elements [begin, end) of the flattened full-model tensor `name` ("m." / "v." prefixed for the
// AdamW moments), as one rank holds them: the unit of sharded checkpoints. Expert tensors are
// addressed in the single-process model's coordinates ([num_experts, ...]), so a checkpoint is
// independent of the world and EP sizes that wrote it.
struct ShardPiece {
  std::string name;
  Shape full_shape;
  int64_t begin = 0, end = 0;
  Tensor data;  // f32 [end - begin]
};
// Fills out[0 .. end - begin) with elements [begin, end) of the full tensor `name`.
using PieceReader =
    std::function<void(const std::string& name, int64_t begin, int64_t end, float* out)>;
// Bytes (f32) of this rank's slices filled so far and in all, after each read.
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

class Fsdp;

class DistTrainer {
 public:
  // Slices the model's experts to this rank's share and wires the expert-parallel exchange.
  // The model must be freshly built with the same seed on every rank.
  DistTrainer(Model& model, const Mesh& mesh, ProcessGroups& groups, const DistOptions& opt);
  ~DistTrainer();

  // Clears gradients and the communication counters of the step.
  void zero_grad();
  // Forward + backward of this rank's micro-batch; gradients accumulate. ids/targets/seq: this
  // rank's documents. Every rank must hold the same number of tokens (ValueError naming the ranks
  // otherwise). Targets and documents may differ: each rank's cross-entropy and sequence aux
  // gradients are weighted by its share of the global targets and documents.
  // Returns the global token-mean loss. The tensors live on the model's device; `valid` is the
  // number of targets that are not -100 (counted from `targets` when negative, which then must
  // be host memory: a GPU caller counts on its host copy rather than reading the device).
  // The micro-batch that ends the accumulation (DistOptions::micro_batches) posts the gradient
  // buckets during its backward: gradients changed after it are not seen by optimizer_step.
  double forward_backward(Context& ctx, const SeqInfo& seq, const Tensor& ids,
                          const Tensor& targets, int64_t valid = -1);
  // Reduces the accumulated gradients (times grad_scale), clips on the global norm, AdamW on the
  // shards, gathers parameters, updates router biases from global loads. Returns the norm.
  double optimizer_step(Context& ctx, float lr, double grad_scale = 1.0);
  // zero_grad + forward_backward + optimizer_step.
  StepResult step(Context& ctx, const SeqInfo& seq, const Tensor& ids, const Tensor& targets,
                  float lr);

  const StepMetrics& metrics() const { return metrics_; }
  // Expert loads of the last optimizer step summed over all ranks, one vector per MoE layer
  // (empty vectors for dense-FFN layers).
  const std::vector<std::vector<int64_t>>& global_loads() const { return loads_; }
  // Bytes of optimizer state held by this rank.
  int64_t optimizer_bytes() const;
  // What this rank holds; `transient` is the peak measured so far (fsdp) or the optimizer
  // step's flat buffers, which are all alive at once (otherwise).
  MemoryReport memory() const;
  // With fsdp: the store's Params hold full values again (collective), for comparisons and
  // export; the next step shards them away. No-op otherwise.
  void gather_params();
  int64_t optimizer_steps() const { return step_; }

  // Placement (docs/load-balancing.md): expert_rank[i][e] = the EP rank holding logical expert e
  // of model layer i from now on (an empty vector leaves layer i as it is); every EP rank must
  // get local_experts of a layer, which it holds in ascending logical order. Each moved expert's
  // weights, gradients and AdamW moments travel to the new owner (one all-to-all-v per layer
  // over the EP group) and the layer dispatches by the new slots, so the model computes the same
  // function. Collective over the world, with the same argument on every rank; call it between
  // optimizer steps. Returns how many experts changed rank. No-op without expert parallelism.
  int64_t place_experts(const std::vector<std::vector<int32_t>>& expert_rank);
  // Logical expert -> slot (EP rank * local_experts + local index) of model layer i; empty while
  // the layer keeps the contiguous layout.
  std::vector<int32_t> expert_slots(int layer) const;

  // What this rank writes to a sharded checkpoint: weights split evenly over the ranks that hold
  // the same values (dense: the world; experts: the EDP replicas), moments as this rank's shard.
  std::vector<ShardPiece> checkpoint_pieces() const;
  // Loads weights and moments written by any mesh (or one process) through `read`.
  void load_pieces(const PieceReader& read, int64_t optimizer_steps);
  // Loads weights alone (moments and the step count stay): each rank asks `read` for exactly the
  // ranges it holds (its FSDP shards, its experts or their shard, whatever it keeps whole), in
  // single-process coordinates. With ModelOptions::defer_weights and an HF reader
  // (io/hf_names.h, HfSliceReader) no rank reads or holds more of a checkpoint than its slices.
  // `progress` (optional) hears of every read, against the total of the rank's slices.
  void load_weights(const PieceReader& read, const LoadProgress& progress = {});

 private:
  struct Unit;
  struct Bucket;
  struct BucketHooks;  // dist_buckets.cpp: posts buckets from the model's unit hooks
  void plan_buckets();
  void pack_bucket(Context& ctx, Bucket& b);
  void post_bucket(Context& ctx, Bucket& b);
  // After unit u's backward: posts the buckets it completes (in the micro-batch that ends the
  // accumulation).
  void unit_backward_done(int u);
  // This rank's shares of the global targets and documents of a micro-batch.
  struct Shares {
    int64_t valid = 0;
    double ce = 0, docs = 0;
  };
  Shares check_balanced(const SeqInfo& seq, const Tensor& targets, int64_t valid);
  bool is_local_expert(const Param& p) const;
  // Model unit of a parameter: 0 embedding, 1 + i layer i, num_units() - 1 the head.
  int model_unit(const Param& p) const;
  // Splits elements [lo, hi) of this rank's tensor p into runs that are contiguous in the
  // single-process tensor: fn(global begin, local begin, count). Experts of a placed layer are
  // not contiguous there; everything else is one run.
  template <typename F>
  void global_runs(const Param& p, int64_t lo, int64_t hi, F&& fn) const;
  // Every run of this rank's moment shards: fn(unit, param, global begin, index into the
  // unit's m and v, count).
  template <typename F>
  void moment_runs(F&& fn) const;
  void setup_fsdp();
  // This rank's shape of p (a sharded Param's gathered shape; local experts: the EP slice).
  Shape local_shape(const Param& p) const;
  void update_router_biases(Context& ctx);  // dist_router_bias.cpp

  Model& model_;
  Device dev_;  // the model's: every step buffer, moment and shard lives there
  Mesh mesh_;
  ProcessGroups& g_;
  DistOptions opt_;
  std::vector<std::unique_ptr<ExpertParallel>> ep_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::unique_ptr<Fsdp> fsdp_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<BucketHooks> bucket_hooks_;  // after fsdp_: it forwards to it, dies first
  Context* step_ctx_ = nullptr;                // forward_backward's, for the hooks' ops
  int micro_ = 0;                              // micro-batches since zero_grad
  int64_t step_ = 0;
  std::vector<std::vector<int64_t>> loads_;        // per model layer, sized once
  std::vector<MoeLayer*> moe_layers_;              // per model layer (null: dense), as loads_
  std::vector<int64_t> balance_;                   // check_balanced's gather, kept
  Tensor pflat_, mine_;                            // parameter scratch of the largest unit / shard
  std::vector<Tensor> norm_grads_;                 // the shards the norm counts, refilled in place
  Tensor norm_sq_;                                 // f64 [1]: their sum of squares
  std::vector<std::vector<int32_t>> slots_;        // per model layer, see expert_slots()
  std::unordered_map<const Param*, int> unit_of_;  // see model_unit()
  StepMetrics metrics_;
};

}  // namespace mt::par
