// The training loop, independent of where the math runs. A StepExecutor owns the model, the
// optimizer and the device: today LocalExecutor (one process, CPU); a parallel engine (FSDP + EP)
// or a GPU backend implements the same five calls and the loop, schedule, data order, metrics and
// checkpoints stay as they are.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/context.h"
#include "model/model.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/dataset.h"
#include "train/device_batch.h"
#include "train/job.h"

namespace mt {

namespace par {
class Comm;
}

struct LayerLoad {
  int layer = 0;
  double max_over_mean = 0, hot_cold = 0;  // hot_cold: busiest / least busy live expert
  int64_t dead = 0;                        // experts that got no token this step
  std::vector<int64_t> load;               // (token, slot) pairs per expert (load balancing)
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual void zero_grad() = 0;
  // Forward + backward of one micro-batch; gradients accumulate. Returns the mean loss.
  virtual double forward_backward(const Batch& b) = 0;
  // Forward only (evaluation); leaves gradients and routing statistics alone.
  virtual double forward_loss(const Batch& b) = 0;
  // Scales gradients by grad_scale (1 / accumulation), clips, steps. Returns the gradient norm.
  virtual double optimizer_step(float lr, double grad_scale) = 0;
  // Routing load since the last step and auxiliary losses of the last forward.
  // Both refer to the executor's own storage, refilled in place (a step's reads allocate nothing).
  virtual const std::vector<LayerLoad>& expert_load() = 0;
  virtual const std::vector<AuxLoss>& aux_losses() = 0;

  // Checkpoints in the executor's own layout (one process: checkpoint.h; a mesh: sharded).
  // Loading accepts either layout. Collective on a mesh: every rank calls them.
  virtual std::string save(const std::string& root, const TrainState& st,
                           const std::string& job_toml) = 0;
  virtual TrainState load(const std::string& dir) = 0;
  // Rank 0 of a mesh logs and writes run files; others stay quiet.
  virtual bool is_root() const { return true; }
  // Extra per-step fields for metrics.jsonl (communication totals on a mesh). Collective.
  virtual void add_metrics(nlohmann::json& line) { (void)line; }
  // All-to-all chunks from the next step on (forecast-driven compensation); no-op without an
  // expert-parallel exchange. Every rank passes the same count.
  virtual void set_a2a_chunks(int chunks) { (void)chunks; }
  // Placement between optimizer steps (balance.placement): expert -> EP rank per model layer.
  // Moves experts with their optimizer state on a mesh; one process has nothing to move.
  virtual void place_experts(const std::vector<std::vector<int32_t>>& expert_rank) {
    (void)expert_rank;
  }
  // What this process holds for training, one line (`moetrain train --dry-run`).
  virtual std::string memory_line() const { return ""; }
};

// The same into s, reusing its load vector's capacity.
void fill_layer_load(LayerLoad& s, int layer, const std::vector<int64_t>& load);

class LocalExecutor : public StepExecutor {
 public:
  LocalExecutor(Context& ctx, Model& model, AdamW& opt) : ctx_(ctx), model_(model), opt_(opt) {}
  std::string save(const std::string& root, const TrainState& st,
                   const std::string& job_toml) override;
  TrainState load(const std::string& dir) override;
  void zero_grad() override { model_.params().zero_grad(); }
  double forward_backward(const Batch& b) override;
  double forward_loss(const Batch& b) override;
  double optimizer_step(float lr, double grad_scale) override;
  const std::vector<LayerLoad>& expert_load() override { return load_; }
  const std::vector<AuxLoss>& aux_losses() override { return model_.aux_losses(); }

 private:
  Context& ctx_;
  Model& model_;
  AdamW& opt_;
  std::vector<LayerLoad> load_;
  std::vector<Tensor> grads_;  // the trainable gradients, refilled each step
  DeviceBatch staged_;         // batches copied to the context's device
};

// Learning rate at optimizer step `step` (1-based): linear warm-up, then cosine to
// lr * min_lr_ratio at the last step.
double schedule_lr(const Job& job, int64_t step);

// Token-weighted held-out loss over the first `max_sequences` sequences (0 = all).
struct EvalResult {
  double loss = 0;  // NaN (absent) when the data holds no target token
  int64_t tokens = 0;
};
EvalResult evaluate(StepExecutor& exec, const PackedData& data, int64_t batch,
                    int64_t max_sequences);

// Cross-entropy of a unigram (token-frequency, add-one smoothed) model fitted on `train`,
// measured on the targets of `heldout`: the baseline a language model must beat. NaN when
// `heldout` has no target.
double unigram_baseline(const PackedData& train, const PackedData& heldout);

struct TrainResult {
  std::vector<double> losses;              // per optimizer step run by this call
  int64_t first_step = 1;                  // step number of losses[0]
  std::map<std::string, EvalResult> eval;  // after the last step
  int64_t trainable = 0, total = 0;
  double tokens_per_s = 0, seconds = 0;
  std::vector<double> step_seconds;  // wall time of each optimizer step run by this call
  std::string checkpoint;            // the last one written
  int64_t skipped_steps = 0;         // non-finite steps not applied (train.nonfinite = "skip")
  int64_t failed_saves = 0;  // checkpoint saves that failed (checkpoint.on_error = "continue")
};

struct TrainOptions {
  bool resume = false;      // continue from the run directory's latest checkpoint
  std::string resume_from;  // or from this checkpoint
  // The job's processes (mpirun): the mesh comes from the job's [parallel] keys, each rank takes
  // its slice of every global micro-batch, rank 0 logs. Null: one process, LocalExecutor.
  par::Comm* world = nullptr;
  // Build the mesh, the model and its shards, print what each rank holds, and stop (no data
  // read beyond the dataset header checks, no step, no files written).
  bool dry_run = false;
  // Write checkpoints (checkpoint.every and the last step's). Off for runs that only measure
  // (train/tune.h): nothing is saved.
  bool save_checkpoints = true;
};

// Runs a job end to end: writes <run_dir>/job.toml, metrics.jsonl and checkpoints/, prints
// progress on `log` (rank 0 only on a mesh).
TrainResult run_job(const Job& job, const TrainOptions& opt, std::ostream& log);

}  // namespace mt
