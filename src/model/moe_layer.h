// Latent Mixture-of-Experts block (Nemotron-3 LatentMoE layout, DeepSeek-V3 routing):
//   logits = x W_gate^T on the full hidden size; router -> (expert ids, gate weights)
//   x_lat  = latent_down_proj(x)                       (absent when latent == hidden)
//   y_lat  = sum_slot w_slot * Expert_slot(x_lat)      (dispatch, grouped SwiGLU, combine)
//   y      = latent_up_proj(y_lat) + shared_experts(x) (shared: one SwiGLU on the full width)
// Routing is computed on x, the experts run on l-dim tokens, so dispatch traffic and expert
// weights shrink by hidden / latent.
//
// Parameters (local HF-like names): gate.weight [E, d]; gate.e_score_correction_bias [E]
// (Buffer, only with selection_bias); latent_{down,up}_proj.weight (only when latent < hidden);
// experts.gate_up_proj [E, 2F, l], experts.down_proj [E, l, F] (Expert role); with expert LoRA
// experts.{gate_up,down}_lora_{A,B} (Lora role, so they train with a frozen base; they carry a
// leading expert dimension like the base tensors); shared_experts.{gate,up,down}_proj.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/config.h"
#include "model/layer.h"
#include "model/linear_module.h"
#include "ops/grouped_ffn.h"
#include "ops/overflow_route.h"
#include "ops/router.h"

namespace mt {

// What an ExpertCompute's forward keeps for its backward: made by its make_state(), held in the
// MoE layer's Saved, so each micro-batch in flight has its own (as every layer state has).
struct ExpertState {
  virtual ~ExpertState() = default;
};

// Runs the routed experts somewhere else (expert parallelism, src/parallel). The layer hands it
// the rows of its tokens sorted by global expert and gets the expert outputs back in the same
// order; the weights it passes are the layer's local experts only. One instance per layer; what
// backward needs goes into the caller's ExpertState, never into the instance.
class ExpertCompute {
 public:
  virtual ~ExpertCompute() = default;
  virtual std::unique_ptr<ExpertState> make_state() const = 0;
  // rows [N, l] sorted by expert, offsets i32 [E+1] over all experts -> out [N, l] (written).
  virtual void forward(Context& ctx, const ops::GroupedFfnParams& p, const Tensor& rows,
                       const Tensor& offsets, const ops::GroupedFfnWeights& local, Tensor& out,
                       ExpertState& st) = 0;
  // dout [N, l] -> drows [N, l] (written); local expert grads accumulate, or are written where
  // p.weight_grads_zero says they hold zeros. Consumes st's forward.
  virtual void backward(Context& ctx, const ops::GroupedFfnParams& p,
                        const ops::GroupedFfnWeights& local, const Tensor& dout, Tensor& drows,
                        ops::GroupedFfnWeights& local_grads, ExpertState& st) = 0;
};

class MoeLayer : public Layer {
 public:
  explicit MoeLayer(const MoeConfig& cfg);

  std::vector<ParamSpec> param_specs() const override;
  void bind(const ParamTable& params) override;
  void plan_activations(const SeqInfo& seq, ArenaPlan& plan) const override;
  // What forward keeps (views into acts, x kept by the caller).
  struct Saved : LayerState {
    Tensor x, logits, scores, ids, weights, perm, inv, offsets;
    // offsets where the grouped GEMMs read them: offsets itself on the CPU, else offsets_host
    // (a host buffer of this state, made by its first forward on a GPU).
    Tensor group_offsets, offsets_host;
    Tensor x_lat, rows, rows_out, y_lat, sh_gate, sh_up, sh_h;
    ops::GroupedFfnSaved ffn;
    bool overflow = false;  // routed by the overflow policy (its backward differs)
    LinearModule::Saved latent_down, latent_up, shared_gate, shared_up, shared_down;
    // Under expert parallelism: the ExpertCompute's state, made by the first forward through
    // `expert_by` (and again when the layer's compute changes).
    std::unique_ptr<ExpertState> expert;
    const ExpertCompute* expert_by = nullptr;
  };
  std::unique_ptr<LayerState> make_state() const override { return std::make_unique<Saved>(); }
  void forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
               LayerState& st) override;
  void backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                LayerState& st) override;
  // "router_seq_aux" and "router_z" of the last forward (unweighted values, weights = the config
  // coefficients); backward applies their gradients when the coefficient is non-zero.
  std::span<const AuxTerm> aux_terms() const override { return aux_; }

  // (token, slot) pairs routed to each expert, summed over the forwards since the last
  // reset_expert_load() / update_selection_bias() (so gradient accumulation counts a whole step).
  // On a GPU the count lives on the device; reading it is a synchronisation point (the trainer
  // reads it once, after the step).
  const std::vector<int64_t>& expert_load() const;
  void reset_expert_load();
  // Activation recompute (Model) replays a forward in backward; it restores the count so that
  // the replay is not counted twice.
  void set_expert_load(std::vector<int64_t> load);
  // Aux-loss-free balancing after the optimizer step: b_i += rate * sign(mean(load) - load_i),
  // queued on ctx's stream. The first form uses this layer's count and resets it (on a GPU it
  // reads the count where it lives: no copy, no wait); the second takes a load summed across
  // ranks (one copy to the device). No-op without selection_bias.
  void update_selection_bias(Context& ctx);
  void update_selection_bias(Context& ctx, const std::vector<int64_t>& load);
  // Multiplies the sequence aux loss's gradient: data parallelism weights each rank's
  // per-document mean by its share of the global documents (Model::set_loss_weight).
  void set_seq_aux_weight(float w) { seq_aux_weight_ = w; }
  // The routed experts' grouped GEMM configuration (ops/grouped_matmul.h; a job's
  // kernels.grouped_gemm); unset: MOETRAIN_GROUPED_GEMM's or the default.
  void set_grouped_gemm(std::optional<ops::GroupedGemmConfig> c) { gemm_ = c; }
  const std::optional<ops::GroupedGemmConfig>& grouped_gemm() const { return gemm_; }

  // Whether the routed experts run K-concatenated (ops/grouped_ffn.h, grouped_ffn_kconcat) with
  // base weights of this device and dtype: expert LoRA in bf16 on the GPU, experts computed here
  // (expert parallelism keeps the separate passes). The model then keeps experts.gate_up_proj and
  // experts.down_proj in their padded buffers (Model::pad_experts), and the layer pads its rows.
  bool pads_expert_weights(Device device, DType dtype) const;

  // Expert ids i32 [T, k] of the last forward (a view into its activations), for routing stats.
  const Tensor& last_expert_ids() const { return last_ids_; }
  const MoeConfig& config() const { return cfg_; }

  // Expert parallelism: this rank holds experts [first, first + count) (bind() then expects expert
  // tensors with a leading dimension of count) and `compute` (not owned; null = all experts are
  // local and run here) moves the rows to the experts' owners. Routing still covers all experts.
  void set_local_experts(int64_t first, int64_t count, ExpertCompute* compute);
  // Placement (parallel/dist_trainer.h, place_experts): slot_of[e] = the position of logical
  // expert e in the owners' concatenated local slots (EP rank * count + local slot); empty =
  // identity. Rows are dispatched in slot order, so each owner still receives one contiguous
  // segment; routing, loads, biases and traces stay in logical ids.
  void set_expert_slots(std::vector<int32_t> slot_of);
  const std::vector<int32_t>& expert_slots() const { return slot_of_; }
  int64_t local_expert_first() const { return expert_first_; }
  int64_t local_expert_count() const { return expert_count_; }
  ExpertCompute* expert_compute() const { return remote_; }
  // Load balancing (ops/overflow_route.h, docs/load-balancing.md): the router proposes
  // top_k + p.extra candidates and the bounded overflow policy picks each token's experts, with
  // expert_rank[e] the EP rank holding expert e. p.tokens / experts / top_k are filled per forward.
  // Backward flows through the final experts' gate weights. Not used by decode_step.
  void set_overflow_policy(const ops::OverflowParams& p, std::vector<int32_t> expert_rank);
  void clear_overflow_policy() { overflow_on_ = false; }
  // Statistics of the last forward's rerouting (zeros without a policy).
  const ops::OverflowStats& last_overflow() const { return overflow_stats_; }
  // Routing traces (docs/load-balancing.md#trace-format): with width > 0 every forward keeps each
  // token's top-`width` candidates (descending selection score) and their selection scores
  // (score + bias), [T, width] row-major. 0 switches it off.
  void set_trace_width(int64_t width);
  const std::vector<int32_t>& trace_candidates() const { return trace_cand_; }
  const std::vector<float>& trace_priorities() const { return trace_prio_; }
  // Inference only (decode/decode.h): forward on x [n, hidden] (one document `seq`) without
  // counting expert load and without reading the device's count; saved activations in `acts`
  // (grown to fit, reset by each call).
  void decode_step(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts);

 private:
  ops::RouterParams router_params(int64_t tokens) const;
  ops::GroupedFfnParams ffn_params(int64_t tokens) const;
  // ffn_params with padded_rows set where the experts' rows get r spare columns (the
  // K-concatenation path); the row padding is then p.lora_rank, else 0.
  ops::GroupedFfnParams ffn_params(int64_t tokens, Device device, DType at) const;
  bool has_latent() const { return cfg_.latent < cfg_.hidden; }
  int64_t shared_width() const { return cfg_.num_shared * cfg_.shared_ffn; }

  MoeConfig cfg_;
  LinearModule latent_down_, latent_up_, shared_gate_, shared_up_, shared_down_;
  ParamRef gate_, bias_;
  ops::GroupedFfnWeights experts_, experts_grad_;
  // The base expert weights' ParamStore flags "gradient holds zeros" (null when unknown).
  std::array<bool*, 2> experts_grad_zero_{};
  // Whether both base expert gradients hold zeros; clears the flags (they are written next).
  bool take_experts_grad_zero();

  Tensor last_ids_;             // the last forward's expert ids (a readout)
  std::array<AuxTerm, 2> aux_;  // router_seq_aux, router_z: written by the router's loss ops
  Tensor load_t_;               // i64 [E]: a load handed to update_selection_bias
  float seq_aux_weight_ = 1.f;
  std::optional<ops::GroupedGemmConfig> gemm_;
  mutable std::vector<int64_t> load_;  // on the host; behind load_dev_ when load_stale_
  Tensor load_dev_;                    // i64 [E]: the count on a GPU
  mutable bool load_stale_ = false;
  int64_t expert_first_ = 0, expert_count_ = 0;
  ExpertCompute* remote_ = nullptr;
  std::vector<int32_t> slot_of_, expert_at_;  // logical -> slot and back (empty: identity)
  Tensor slot_of_t_, expert_at_t_;            // the same on the step's device
  bool overflow_on_ = false;
  ops::OverflowParams overflow_;
  std::vector<int32_t> overflow_rank_;
  ops::OverflowStats overflow_stats_;
  int64_t trace_width_ = 0;
  std::vector<int32_t> trace_cand_;
  std::vector<float> trace_prio_;
};

}  // namespace mt
