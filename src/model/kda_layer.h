// Kimi Delta Attention layer (HF kimi_linear parameter names), per document:
//
//   q, k, v = SiLU(ShortConv(W_{q,k,v} x));  q, k L2-normalised per head (eps 1e-6)
//   g       = -exp(A_log) * softplus(f_b(f_a x) + dt_bias)            (ops::kda_gate)
//   beta    = sigmoid(b_proj x)
//   o       = KDA(q, k, v, g, beta)     chunked or token-by-token, zero initial state
//   y       = o_proj( RMSNorm_head(o) * o_norm.weight * sigmoid(g_b(g_a x)) )
//
// Head dims are dk = dv = head_dim. Every projection is a LinearModule (LoRA from cfg.lora); the
// short convolutions, A_log, dt_bias and o_norm are plain parameters.
#pragma once

#include <vector>

#include "model/config.h"
#include "model/layer.h"
#include "model/linear_module.h"
#include "ops/kda.h"

namespace mt {

struct KdaDecodeState;
struct DecodeInputs;

class KdaLayer : public Layer {
 public:
  explicit KdaLayer(const KdaConfig& cfg);

  // Whether the layer keeps the chunked kernels' intra-chunk products from forward to backward
  // on `device` (ops/kda.h, `prepared`): on the GPU where the kernels take the params, and only
  // with cp.kernels.keep_prepared (off by default: 1.0 GiB per layer at B2 T8192, 32 heads of
  // 128, four times the bf16 chunk states, to spare backward one prep pass of ~0.7 ms).
  // The planner reads the same rule. The chunk states take ops::kda_saved_dtype.
  static bool keeps_prepared(Device device, const ops::KdaParams& cp);

  std::vector<ParamSpec> param_specs() const override;
  void bind(const ParamTable& params) override;
  void plan_activations(const SeqInfo& seq, ArenaPlan& plan) const override;
  // What forward keeps: views into `acts` (x itself is kept by the projections' states).
  struct Saved : LayerState {
    Tensor qp, kp, vp;      // projections [T, H*K]
    Tensor qs, ks;          // after SiLU (L2-norm inputs)
    Tensor q, k, v;         // core inputs [T, H, K]
    Tensor q_rstd, k_rstd;  // [T * H]
    Tensor fa, graw;        // gate low-rank, pre-activation (g is formed again in backward)
    Tensor beta;            // [T, H]
    Tensor o, states;       // core output [T, H, K] and its saved states
    Tensor prepared;        // the CUDA chunked kernels' products, forward to backward (ops/kda.h)
    Tensor on, o_rstd;      // per-head RMSNorm output and rstd [T * H]
    Tensor ga, gb, og;      // output-gate low-rank, gate pre-activation, gated output
    LinearModule::Saved q_proj, k_proj, v_proj, f_a, f_b, b_proj, g_a, g_b, o_proj;
  };
  std::unique_ptr<LayerState> make_state() const override { return std::make_unique<Saved>(); }
  void forward(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y, Arena& acts,
               LayerState& st) override;
  void backward(Context& ctx, const SeqInfo& seq, const Tensor& dy, Tensor& dx,
                LayerState& st) override;

  const KdaConfig& config() const { return cfg_; }
  // Inference only (decode/decode.h): x [n, hidden] continues the document `st` holds; `in`
  // holds the step's offsets on x's device.
  void decode_step(Context& ctx, const DecodeInputs& in, KdaDecodeState& st, const Tensor& x,
                   Tensor& y);

 private:
  ops::KdaParams core_params(const SeqInfo& seq) const;
  int64_t hk() const { return cfg_.heads * cfg_.head_dim; }
  // SiLU(ShortConv(proj)) and its backward for one of q, k, v: one op each way
  // (CausalConvParams::silu), backward forming the conv's output again from proj.
  void conv_silu_forward(Context& ctx, const SeqInfo& seq, const ParamRef& w, const Tensor& proj,
                         Tensor& out);
  void conv_silu_backward(Context& ctx, const SeqInfo& seq, const ParamRef& w, const Tensor& proj,
                          const Tensor& dout, Tensor& dproj);
  // The steps forward and decoding share, for n rows; what backward needs of them goes to `s`
  // (tensors in `acts`).
  // q, k [n, H, K] = per-head L2 norms of the SiLU outputs qs, ks [n, H*K].
  void qk_l2norm(Context& ctx, const Tensor& qs, const Tensor& ks, Tensor& q, Tensor& k,
                 Arena& acts, Saved& s) const;
  // The log decay g [n, H*K] and beta [n, H] from x.
  void decay_and_beta(Context& ctx, const Tensor& x, Tensor& g, Tensor& beta, Arena& acts,
                      Saved& s) const;
  // y = o_proj(RMSNorm_head(o) * sigmoid(g_b(g_a x))), o [n, H, K].
  void gated_output(Context& ctx, const Tensor& x, const Tensor& o, Tensor& y, Arena& acts,
                    Saved& s) const;

  KdaConfig cfg_;
  LinearModule q_proj_, k_proj_, v_proj_, f_a_, f_b_, b_proj_, g_a_, g_b_, o_proj_;
  ParamRef q_conv_, k_conv_, v_conv_, a_log_, dt_bias_, o_norm_;
};

}  // namespace mt
