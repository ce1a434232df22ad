// Gated DeepSeek Sparse Attention: MlaLayer whose keys per query are chosen by the lightning
// indexer (top-k of I[t, s] over the causal positions of the query's document), plus the
// indexer's KL loss against the main attention.
//
// Indexer (HF deepseek_v32 names, under "indexer."):
//   qi = RoPE(wq_b(cqn))            [T, HI, DI], cqn = q_a_layernorm output, detached
//   ki = RoPE(LayerNorm(wk x))      [T, DI], k_norm weight and bias, eps indexer_norm_eps
//   w  = weights_proj(x) * HI^-0.5  [T, HI], no activation
// RoPE is half-split on the first index_rope_dim dims (DeepSeek's fixed indexer, not MLA's
// interleaved style), with MLA's theta.
//
// Training signal (DeepSeek-V3.2 paper, sec. 2.1):
// - Sparse stage (dense_warmup = false): attention runs on the top-k set; the LM gradient
//   reaches every MLA parameter and x but never the indexer (selection is discrete). The KL loss
//   on the selected set, L = (1/T) sum_t KL(p_t || softmax(I_t)) with p_t the head-summed
//   attention probabilities L1-normalised (a constant), trains only the indexer: its inputs are
//   detached, so it contributes nothing to dx or to q_a_proj. Its gradient enters backward
//   multiplied by indexer_loss_coeff.
// - Where the KL is formed: a forward whose backward follows (LayerState::backward_follows,
//   Model::Pass::Train) leaves it to backward, whose attention backward recomputes every P anyway
//   and sums them over the heads on the way (sparse_mqa_backward's prob_sum; the per-head form
//   runs attention_prob_sum there): the loss is then readable after backward. Any other forward
//   forms it at once, from a prob-sum pass of its own (evaluation, the layer tests'
//   finite differences). Both give the same loss and gradient.
// - Dense warm-up (dense_warmup = true): attention is dense causal and the KL target covers all
//   causal positions. The MLA parameters are frozen: they are bound without gradients, so
//   backward adds nothing to them (their grad buffers are left untouched). dx is still the exact
//   gradient of the frozen dense layer, so the layers below keep a correct signal.
#pragma once

#include <vector>

#include "model/mla_layer.h"

namespace mt {

class DsaLayer : public MlaLayer {
 public:
  explicit DsaLayer(const DsaConfig& cfg);

  std::vector<ParamSpec> param_specs() const override;
  void bind(const ParamTable& params) override;
  // MLA's state plus the indexer's.
  struct Saved : MlaLayer::Saved {
    Tensor qi;                  // [T, HI * DI] after RoPE
    Tensor ki, k_mean, k_rstd;  // wk x and its LayerNorm statistics
    Tensor kn;                  // [T, DI] normalised and rotated key
    Tensor wts;                 // [T, HI] scaled head weights
    Tensor dscores;             // [T, slots] the KL's gradient into I (indexer_loss_coeff != 0)
    // The KL waits for backward (backward_follows): its target is then the attention backward's
    // by-product, and dscores is written there.
    bool kl_in_backward = false;
    LinearModule::Saved wq_b, wk, weights_proj;
  };
  std::unique_ptr<LayerState> make_state() const override { return std::make_unique<Saved>(); }
  void backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                LayerState& st) override;
  std::span<const AuxTerm> aux_terms() const override { return {&kl_, 1}; }

  const DsaConfig& dsa_config() const { return dcfg_; }
  // Attention over the selection in the absorbed MQA form (MlaLayer::absorbs; on by default)
  // or per head (the reference the tests compare it with).
  void set_absorbed(bool on) { absorb_ = on; }
  // The selected key positions of the last forward, i32 [T, slots] (increasing, -1 padded).
  const Tensor& selected() const { return selected_; }

 protected:
  int64_t index_slots(const SeqInfo& seq) const override;
  bool selects_every_key(const SeqInfo& seq) const override;
  void plan_selection(const SeqInfo& seq, ArenaPlan& plan) const override;
  void select_keys(Context& ctx, const SeqInfo& seq, const Tensor& x, Arena& acts,
                   MlaLayer::Saved& s) override;
  void after_attention(Context& ctx, const SeqInfo& seq, Arena& acts, MlaLayer::Saved& s) override;
  Tensor decode_select(Context& ctx, AttnDecodeState& st, const Tensor& x, const Tensor& cqn,
                       const Tensor& positions) override;

 private:
  float weight_scale() const;
  // The KL's target (P summed over the heads per slot) over s.idx from the forward's lse, as its
  // own pass: the per-head form's attention_prob_sum, or the absorbed form's sparse_mqa_prob_sum
  // (s.qa valid).
  void kl_target(Context& ctx, int64_t tokens, Saved& s, Tensor& target) const;
  // The loss into kl_ and, with a coefficient, its gradient into s.dscores, from the target.
  void indexer_kl(Context& ctx, int64_t tokens, Saved& s, const Tensor& target);
  // The indexer's half-split RoPE on [tokens, HI, DI] (heads = 1 for its key).
  ops::RopeParams index_rope(int64_t tokens) const;
  // The indexer's projections, shared by forward and decoding, for the rows of x at `positions`:
  // qi [n, HI * DI], kn [n, DI] (a row view of a key cache is fine), wts [n, HI] scaled; the
  // LayerNorm's input and statistics go to `s`, their tensors in `acts`.
  void project_indexer(Context& ctx, const Tensor& x, const Tensor& cqn, const Tensor& positions,
                       Tensor& qi, Tensor& kn, Tensor& wts, Arena& acts, Saved& s) const;

  DsaConfig dcfg_;
  LinearModule wq_b_, wk_, weights_proj_;
  ParamRef k_norm_w_, k_norm_b_;

  AuxTerm kl_;       // "indexer_kl", written by the indexer's KL op (a readout)
  Tensor selected_;  // the last forward's s.idx (a readout)
};

}  // namespace mt
