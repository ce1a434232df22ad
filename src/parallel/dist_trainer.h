// One data-parallel training step over a mesh: every rank runs forward/backward on its own
// documents (experts reached through ExpertParallel), then
//   dense units (embedding, each layer, the head): flat gradient buffers reduce-scattered over the
//     world, AdamW on this rank's flat shard (moments exist for the shard only), parameters
//     all-gathered back;
//   local experts: gradients summed over the EDP replicas (all-reduce, or reduce-scatter with
//     shard_experts), AdamW on the local experts (or their shard);
//   gradient clipping on the global norm (each element counted once across the world);
//   aux-loss-free router bias from expert loads all-reduced over the world.
// With the same documents split evenly, this is the single-process step on all of them: the
// global loss is the mean of the ranks' means, so every gradient is scaled by 1 / world.
//
// Not yet FSDP in memory: ranks keep full dense parameter tensors between steps (the gather before
// use / free after use needs per-layer hooks in Model); gradients are sharded only in the step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/seq_info.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "parallel/expert_parallel.h"
#include "parallel/mesh.h"
#include "train/adamw.h"

namespace mt::par {

struct DistOptions {
  int a2a_chunks = 1;
  AdamWOptions adam;
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
  std::string line(int rank) const;  // one human-readable line per rank
};

class DistTrainer {
 public:
  // Slices the model's experts to this rank's share and wires the expert-parallel exchange.
  // The model must be freshly built with the same seed on every rank.
  DistTrainer(Model& model, const Mesh& mesh, ProcessGroups& groups, const DistOptions& opt);
  ~DistTrainer();

  // ids/targets/seq: this rank's documents. Every rank must hold the same number of tokens,
  // documents and non-ignored targets (ValueError naming the ranks otherwise).
  StepResult step(Context& ctx, const SeqInfo& seq, const Tensor& ids, const Tensor& targets,
                  float lr);
  const StepMetrics& metrics() const { return metrics_; }
  // Bytes of optimizer state held by this rank.
  int64_t optimizer_bytes() const;

 private:
  struct Unit;
  void check_balanced(const SeqInfo& seq, const Tensor& targets);

  Model& model_;
  Mesh mesh_;
  ProcessGroups& g_;
  DistOptions opt_;
  std::vector<std::unique_ptr<ExpertParallel>> ep_;
  std::vector<std::unique_ptr<Unit>> units_;
  int64_t step_ = 0;
  StepMetrics metrics_;
};

}  // namespace mt::par
