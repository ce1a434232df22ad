// Multi-head latent attention (DeepSeek-V3 layout, HF deepseek_v3 parameter names), dense causal
// within each document, with an optional element-wise sigmoid output gate (Gated Attention, G1):
//
//   q      = q_b_proj(RMSNorm_qa(q_a_proj x))          (or q_proj x when q_lora_rank == 0)
//   [c|kpe] = kv_a_proj_with_mqa x;  [k_nope_h | v_h] = kv_b_proj(RMSNorm_kva(c))
//   q_h = [q_nope_h | RoPE(q_pe_h)],  k_h = [k_nope_h | RoPE(kpe)]  (kpe shared by all heads)
//   o   = softmax(scale q k^T + causal) v;  out = o_proj(o * sigmoid(g_proj x))  (gate optional)
//
// The attention runs through ops::attention with an index table, which DsaLayer replaces by its
// indexer's top-k selection (the protected hooks below).
#pragma once

#include <vector>

#include "model/config.h"
#include "model/layer.h"
#include "model/linear_module.h"
#include "ops/attention.h"
#include "ops/rope.h"
#include "ops/sparse_mqa_attention.h"

namespace mt {

struct AttnDecodeState;
struct DecodeInputs;

// The per-head products of MLA's absorbed form on kv_b_proj's weight w [H (nope + Dv), kvr]
// (rows of head h: W_UK,h [nope, kvr], then W_UV,h [Dv, kvr]), one matmul per head on column
// views. Shared by MlaLayer and `moetrain bench dsa`.
struct MlaAbsorbDims {
  int64_t heads = 0, nope = 0, rope = 0, v_dim = 0, kv_rank = 0;
  int64_t qk() const { return nope + rope; }
  int64_t latent() const { return kv_rank + rope; }
};
// qa [T, H, kvr + rope] = [q_nope,h W_UK,h ; q_pe,h] from q [T, H, nope + rope]. Written.
void mla_absorb_q(Context& ctx, const MlaAbsorbDims& d, const Tensor& w, const Tensor& q,
                  Tensor& qa);
// Its backward: dq [T, H, nope + rope] written from dqa; wgrad (W_UK rows) += q_nope^T dqa
// unless undefined.
void mla_absorb_q_backward(Context& ctx, const MlaAbsorbDims& d, const Tensor& w, const Tensor& q,
                           const Tensor& dqa, Tensor& dq, Tensor& wgrad);
// o [T, H, Dv] = ol_h W_UV,h^T from the latent-space output ol [T, H, kvr]. Written.
void mla_expand_o(Context& ctx, const MlaAbsorbDims& d, const Tensor& w, const Tensor& ol,
                  Tensor& o);
// Its backward: dol [T, H, kvr] = dout_h W_UV,h written; wgrad (W_UV rows) += dout_h^T ol_h
// unless undefined.
void mla_expand_o_backward(Context& ctx, const MlaAbsorbDims& d, const Tensor& w, const Tensor& ol,
                           const Tensor& dout, Tensor& dol, Tensor& wgrad);

class MlaLayer : public Layer {
 public:
  explicit MlaLayer(const MlaConfig& cfg);

  std::vector<ParamSpec> param_specs() const override;
  void bind(const ParamTable& params) override;
  void plan_activations(const SeqInfo& seq, ArenaPlan& plan) const override;
  // What forward keeps (views into `acts`, or of x).
  struct Saved : LayerState {
    Tensor x;
    Tensor cq, q_rstd, cqn;  // q latent before / after its RMSNorm (q_lora_rank > 0)
    Tensor c, kv_rstd, cn;   // kv latent before / after its RMSNorm
    // [T, H, Dqk], [T, H, Dqk], [T, H, Dv] (after RoPE); k and v undefined when absorbed.
    Tensor q, k, v;
    Tensor idx;         // i32 [T, slots] (layers that select keys)
    bool dense = true;  // attention ran densely and causally (no table, or one of every key)
    Tensor o, lse;      // [T, H, Dv], [T, H]
    Tensor g, og;       // gate pre-activation and gated output [T, H * Dv]
    // The absorbed form (absorbs()): q with W_UK folded in [T, H, kvr + rope] (workspace, valid
    // in forward until after_attention returns; backward rebuilds it), the shared latent
    // entries [c_norm | k_pe] [T, kvr + rope], the latent-space output [T, H, kvr].
    bool absorbed = false;
    Tensor qa, kvl, ol;
    // Set by a subclass before backward (DsaLayer's KL target, f32 [T, slots]): the absorbed
    // attention backward writes the head-summed probabilities into it (sparse_mqa_backward).
    Tensor prob_sum;
    LinearModule::Saved q_a, q_b, q_proj, kv_a, kv_b, o_proj, g_proj;
  };
  std::unique_ptr<LayerState> make_state() const override { return std::make_unique<Saved>(); }
  void forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
               LayerState& st) override;
  void backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                LayerState& st) override;

  const MlaConfig& config() const { return cfg_; }
  float softmax_scale() const;
  // Inference only (decode/decode.h): x [n, hidden] continues the document `st` caches; `in`
  // holds the step's positions on x's device.
  void decode_step(Context& ctx, const DecodeInputs& in, AttnDecodeState& st, const Tensor& x,
                   Tensor& y);

 protected:
  // Slots per query of the attention index table for `seq`. 0 here: MLA attends densely and
  // causally inside each document with no table (ops::causal_attention_*); the hooks below run
  // only for a layer that selects keys (DSA).
  virtual int64_t index_slots(const SeqInfo& seq) const;
  // Whether the table select_keys fills for `seq` holds every causal key of every query (DSA's
  // warm-up, or documents no longer than index_topk): attention then runs densely
  // (ops::causal_attention_*, the flash kernels on the GPU), which is the same attention.
  virtual bool selects_every_key(const SeqInfo& seq) const;
  // Activations the hooks save, in addition to the MLA ones.
  virtual void plan_selection(const SeqInfo& seq, ArenaPlan& plan) const;
  // Fills s.idx (i32 [T, index_slots]) once s.q, s.cqn and the keys (s.k, s.v, or s.kvl when
  // absorbed) exist; `s` is the state
  // make_state() made.
  virtual void select_keys(Context& ctx, const SeqInfo& seq, const Tensor& x, Arena& acts,
                           Saved& s);
  // Runs after the attention forward over s.idx (s.o, s.lse valid).
  virtual void after_attention(Context& ctx, const SeqInfo& seq, Arena& acts, Saved& s);
  // Decoding: key positions (i32 [n, slots], workspace) for the n new tokens at `positions`,
  // whose keys are already cached, or an undefined tensor for every causal key (here).
  virtual Tensor decode_select(Context& ctx, AttnDecodeState& st, const Tensor& x,
                               const Tensor& cqn, const Tensor& positions);

  // The projections forward and decoding share, for the rows of x at `positions` (i32); what
  // backward needs of them (latents, rstds, the gate) goes to `s`, its tensors in `acts`.
  // q [n, H, Dqk], after RoPE.
  void project_q(Context& ctx, const Tensor& x, const Tensor& positions, Tensor& q, Arena& acts,
                 Saved& s) const;
  // The latent part: s.c, s.kv_rstd, s.cn (in `acts`) and the rotary key kpe [n, 1, rope]
  // (after RoPE) written.
  void project_latent(Context& ctx, const Tensor& x, const Tensor& positions, Tensor& kpe,
                      Arena& acts, Saved& s) const;
  // k [n, H, Dqk] (after RoPE) and v [n, H, Dv]; row views of a KV cache are fine.
  void project_kv(Context& ctx, const Tensor& x, const Tensor& positions, Tensor& k, Tensor& v,
                  Arena& acts, Saved& s) const;
  // y = o_proj(o * sigmoid(g_proj x)) (o_proj(o) without the gate), o [n, H * Dv].
  void project_out(Context& ctx, const Tensor& x, const Tensor& o, Tensor& y, Arena& acts,
                   Saved& s) const;

  ops::AttentionParams attn_params(int64_t tokens, int64_t slots) const;
  MlaAbsorbDims absorb_dims() const;
  ops::SparseMqaParams mqa_params(int64_t tokens, int64_t slots) const;
  // Whether attention over the index lists runs in the absorbed MQA form (DeepSeek-V3.2's
  // sparse prefill; ops/sparse_mqa_attention.h): q_h W_UK,h against the shared latent entry
  // [c_norm ; k_pe], values the latent, o_h = o_latent,h W_UV,h^T. Same scores and outputs as
  // the per-head form, but one gather per (query, key) serves every head. Only where the layer
  // asks for it (absorb_) and over lists that are not every causal key; a LoRA adapter on
  // kv_b_proj is merged once per pass (absorb_weight).
  bool absorbs(const SeqInfo& seq) const;
  // kv_b_proj's weight as the absorbed form reads it: W itself, or with an adapter
  // W_eff = W + s B A [H (nope + Dv), kvr] built in ctx.workspace() (under the caller's
  // ArenaScope): one GEMM of O r kvr multiply-adds, O = H (nope + Dv), small beside attention.
  Tensor absorb_weight(Context& ctx) const;
  float kv_b_lora_scale() const;
  // RoPE of the queries' rotary part, and of the shared rotary key [tokens, 1, qk_rope_dim].
  ops::RopeParams q_rope(int64_t tokens) const;
  ops::RopeParams k_rope(int64_t tokens) const;
  int64_t qk_dim() const { return cfg_.qk_nope_dim + cfg_.qk_rope_dim; }
  // Drops the gradient of every MLA parameter (the table is copied), so backward computes dx
  // only. DsaLayer's dense warm-up binds through this.
  static ParamTable without_grads(const ParamTable& params);

  MlaConfig cfg_;
  LinearModule q_a_, q_b_, q_proj_, kv_a_, kv_b_, o_proj_, g_proj_;
  ParamRef q_norm_, kv_norm_;
  bool absorb_ = false;       // DsaLayer: attend over its selection in the absorbed form
  ParamRef kv_b_w_;           // kv_b_proj.weight, [H (nope + Dv), kvr]: W_UK,h and W_UV,h rows
  ParamRef kv_b_a_, kv_b_b_;  // its LoRA adapter (lora.rank > 0): A [r, kvr], B [O, r]

 private:
  // Attention over s.idx in the absorbed form (s.kvl filled by forward): s.qa (in the caller's
  // workspace scope), s.ol (in `acts`), s.o and s.lse.
  void absorbed_forward(Context& ctx, int64_t tokens, Arena& acts, Saved& s) const;
  // Its backward from the ungated dout: dq [T, H, Dqk] and, for the latent, dcn [T, kvr] and the
  // rotary key's dkpe [T, rope] written; dW_UK, dW_UV accumulated into kv_b_proj's gradient, or
  // with an adapter, dW_eff turned into dA = s B^T dW_eff, dB = s dW_eff A^T (and dW += dW_eff
  // when the base trains).
  void absorbed_backward(Context& ctx, const Saved& s, const Tensor& dout, Tensor& dq, Tensor& dcn,
                         Tensor& dkpe);
  // An adapter's gradients from dW_eff [O, kvr] fp32 (and dW += dW_eff when the base trains).
  void lora_grads_from(Context& ctx, const Tensor& dw_eff);
  // The per-head form's backward, with the same outputs (kv_b_proj's backward included).
  void per_head_backward(Context& ctx, const SeqInfo& seq, const Saved& s, const Tensor& dout,
                         Tensor& dq, Tensor& dcn, Tensor& dkpe);
};

}  // namespace mt
