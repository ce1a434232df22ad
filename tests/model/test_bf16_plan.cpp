// The activation plan under the bf16 policy, against the saved tensors as the layers' math and the
// kernels' dtype contracts name them (docs/gpu.md, bf16 path): activations in bf16; statistics,
// KDA beta and states, router logits, scores and gate weights, the indexer's KL target and
// softmax in fp32; index tables in i32. The same lists priced under fp32 must give the fp32 plan,
// whose allocations the CPU forward runs check (test_tiny_model, tests/layers), so the lists are
// the tensors forward allocates and this test pins the dtype each is planned in. The GPU test
// (tests/cuda/test_cuda_model.cpp) checks that a bf16 forward allocates exactly this plan.
#include <gtest/gtest.h>

#include "harness/model_configs.h"
#include "model/dense_ffn.h"
#include "model/dsa_layer.h"
#include "model/kda_layer.h"
#include "model/mla_layer.h"
#include "model/model.h"
#include "model/moe_layer.h"
#include "ops/attention.h"
#include "ops/kda.h"

namespace mt::test {
namespace {

// One saved tensor of the expected list.
enum class Kind { Act, F32, I32 };

// The expected bytes of a list of saved tensors under an activation dtype.
struct Expected {
  DType at;
  size_t bytes = 0;
  void add(Kind k, const Shape& s) {
    const DType d = k == Kind::Act ? at : k == Kind::F32 ? DType::F32 : DType::I32;
    const size_t raw = static_cast<size_t>(s.numel()) * dtype_size(d);
    bytes += (raw + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  }
  void act(const Shape& s) { add(Kind::Act, s); }
  void f32(const Shape& s) { add(Kind::F32, s); }
  void i32(const Shape& s) { add(Kind::I32, s); }
  // x A^T of each LoRA projection.
  void lora(int n, int64_t T, const LoraSpec& l) {
    for (int i = 0; l.rank > 0 && i < n; ++i) act({T, l.rank});
  }
};

ModelConfig config(bool lora) {
  return test::every_layer_kind(lora);
}

const SeqInfo& docs() {
  static const SeqInfo s = SeqInfo::from_lengths({37, 1, 70, 20});
  return s;
}

void expect_kda(const KdaConfig& c, const SeqInfo& seq, Expected& e) {
  const int64_t T = seq.tokens, H = c.heads, K = c.head_dim, HK = H * K;
  e.lora(9, T, c.lora);
  // q, k, v: projection and SiLU(conv) (the conv's output is formed again in backward)
  for (int i = 0; i < 6; ++i) e.act({T, HK});
  e.act({T, H, K});  // q, k after their L2 norm
  e.act({T, H, K});
  e.f32({T * H});  // their rstds
  e.f32({T * H});
  e.act({T, K});   // f_a x
  e.act({T, HK});  // f_b (f_a x); the decay g lives in the workspace (formed again in backward)
  e.f32({T, H});   // beta: the core reads it in fp32
  e.act({T, H, K});
  const ops::KdaParams cp{.tokens = T,
                          .heads = H,
                          .head_k = K,
                          .head_v = K,
                          .num_seqs = seq.num_seqs,
                          .chunked = c.chunked,
                          .chunk = c.chunk};
  e.f32({ops::kda_saved_rows(cp, seq.cu_seqlens_host), H, K, K});  // states
  e.act({T, HK});                                                  // per-head RMSNorm output
  e.f32({T * H});                                                  // its rstd
  e.act({T, K});                                                   // g_a x
  e.act({T, HK});                                                  // g_b (g_a x)
  e.act({T, HK});                                                  // gated output
}

// `absorbed`: DSA's sparse stage in the absorbed MQA form (MlaLayer::absorbs).
void expect_mla(const MlaConfig& c, int64_t slots, const SeqInfo& seq, Expected& e,
                bool absorbed = false) {
  const int64_t T = seq.tokens, H = c.heads, Dqk = c.qk_nope_dim + c.qk_rope_dim, Dv = c.v_head_dim;
  if (c.q_lora_rank > 0) {
    e.lora(2, T, c.lora);
    e.act({T, c.q_lora_rank});  // q latent, before and after its norm
    e.act({T, c.q_lora_rank});
    e.f32({T});
  } else {
    e.lora(1, T, c.lora);
  }
  const int64_t Da = c.kv_lora_rank + c.qk_rope_dim;
  // kv_a, kv_b, o_proj; the absorbed form never runs kv_b_proj on the latent.
  e.lora(absorbed ? 2 : 3, T, c.lora);
  e.act({T, c.kv_lora_rank});
  e.act({T, c.kv_lora_rank});
  e.f32({T});
  e.act({T, H, Dqk});  // q
  if (absorbed) {
    e.act({T, Da});  // the shared latent entries in place of per-head k, v
  } else {
    e.act({T, H, Dqk});  // k, v
    e.act({T, H, Dv});
  }
  if (slots > 0) e.i32({T, slots});             // the index table of a layer that selects keys
  if (absorbed) e.act({T, H, c.kv_lora_rank});  // the latent output (qa is rebuilt)
  e.act({T, H, Dv});                            // o
  e.f32({T, H});                                // lse
  if (c.output_gate) {
    e.lora(1, T, c.lora);
    e.act({T, H * Dv});
    e.act({T, H * Dv});
  }
}

void expect_dsa(const DsaConfig& c, const SeqInfo& seq, Expected& e) {
  const int64_t T = seq.tokens, HI = c.index_heads, DI = c.index_head_dim;
  const int64_t slots = c.dense_warmup ? ops::max_doc_len(seq) : c.index_topk;
  const bool absorbed =
      !c.dense_warmup && c.mla.qk_nope_dim > 0 && ops::max_doc_len(seq) > c.index_topk;
  expect_mla(c.mla, slots, seq, e, absorbed);
  e.lora(3, T, c.mla.lora);
  e.act({T, HI * DI});  // indexer q, key before and after its LayerNorm, head weights
  e.act({T, DI});
  e.act({T, DI});
  e.act({T, HI});
  e.f32({T});  // LayerNorm mean and rstd
  e.f32({T});
  if (c.indexer_loss_coeff != 0.f) e.f32({T, slots});  // the KL's gradient into the scores
}

void expect_dense(const DenseFfnConfig& c, const SeqInfo& seq, Expected& e) {
  e.lora(3, seq.tokens, c.lora);
  for (int i = 0; i < 3; ++i) e.act({seq.tokens, c.ffn});
}

void expect_moe(const MoeConfig& c, const SeqInfo& seq, Expected& e) {
  const int64_t T = seq.tokens, E = c.num_experts, K = c.top_k, N = T * K, l = c.latent,
                F = c.expert_ffn, S = c.num_shared * c.shared_ffn;
  e.f32({T, E});  // router logits and scores
  e.f32({T, E});
  e.i32({T, K});
  e.f32({T, K});  // gate weights: moe_combine reads them in fp32
  e.i32({N});
  e.i32({N});
  e.i32({E + 1});
  if (l < c.hidden) {
    e.lora(2, T, c.lora);
    e.act({T, l});  // latent input and combined output
    e.act({T, l});
  }
  e.act({N, l});  // gathered rows, expert outputs
  e.act({N, l});
  e.act({N, 2 * F});
  if (c.expert_lora.rank > 0) {
    e.act({N, c.expert_lora.rank});
    e.act({N, c.expert_lora.rank});
    e.act({N, F});  // h, which the down adapter's dA reads in backward
  }
  if (c.num_shared > 0) {
    e.lora(3, T, c.lora);
    for (int i = 0; i < 3; ++i) e.act({T, S});
  }
}

void expect_model(const ModelConfig& cfg, const SeqInfo& seq, Expected& e) {
  const int64_t T = seq.tokens, d = cfg.hidden;
  e.act({T, d});  // embedding = residual 0
  for (const LayerIR& l : cfg.layers) {
    e.act({T, d});  // normed input and its rstd
    e.f32({T});
    if (l.mixer == MixerKind::Kda) expect_kda(cfg.kda, seq, e);
    if (l.mixer == MixerKind::Dsa) expect_dsa(cfg.dsa, seq, e);
    if (l.mixer == MixerKind::Mla) expect_mla(cfg.mla, 0, seq, e);  // dense: no index table
    e.act({T, d});  // residual after the mixer, normed mid, its rstd
    e.act({T, d});
    e.f32({T});
    if (l.ffn == FfnKind::Dense) expect_dense(cfg.dense, seq, e);
    if (l.ffn == FfnKind::Moe) expect_moe(cfg.moe, seq, e);
    e.act({T, d});  // the next residual
  }
  e.act({T, d});  // final norm, its rstd, the loss's log-sum-exp
  e.f32({T});
  e.f32({T});
  e.act({T, d});  // the head's input gradient (a Train forward of a frozen head)
}

size_t planned(const Layer& layer, DType at) {
  ArenaPlan p(at);
  layer.plan_activations(docs(), p);
  return p.bytes();
}

// Each layer's plan under both policies against its expected list.
void check_layers(const ModelConfig& cfg) {
  for (DType at : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(at));
    Expected kda{at}, dsa{at}, mla{at}, dense{at}, moe{at};
    expect_kda(cfg.kda, docs(), kda);
    expect_dsa(cfg.dsa, docs(), dsa);
    expect_mla(cfg.mla, 0, docs(), mla);
    expect_dense(cfg.dense, docs(), dense);
    expect_moe(cfg.moe, docs(), moe);
    EXPECT_EQ(planned(KdaLayer(cfg.kda), at), kda.bytes) << "kda";
    EXPECT_EQ(planned(DsaLayer(cfg.dsa), at), dsa.bytes) << "dsa";
    EXPECT_EQ(planned(MlaLayer(cfg.mla), at), mla.bytes) << "mla";
    EXPECT_EQ(planned(DenseFfn(cfg.dense), at), dense.bytes) << "dense ffn";
    EXPECT_EQ(planned(MoeLayer(cfg.moe), at), moe.bytes) << "moe";
  }
}

TEST(Bf16Plan, EveryLayerPlansItsSavedTensorsInTheirDtypes) {
  check_layers(config(false));
}

TEST(Bf16Plan, LoraAdaptersPlanTheirRankProjectionsInTheActivationDtype) {
  check_layers(config(true));
}

TEST(Bf16Plan, DenseWarmupAndRecurrentKdaPlanTheirOwnShapes) {
  ModelConfig cfg = config(true);
  cfg.dsa.dense_warmup = true;
  cfg.kda.chunked = false;
  cfg.mla.output_gate = false;
  check_layers(cfg);
}

TEST(Bf16Plan, TheModelPlansEveryLayerAndTheHead) {
  for (bool lora : {false, true}) {
    const ModelConfig cfg = config(lora);
    for (const Precision& pr : {Precision::bf16(), Precision::fp32()}) {
      SCOPED_TRACE(cat("lora=", lora, " precision=", precision_name(pr)));
      Expected e{pr.activations};
      expect_model(cfg, docs(), e);
      EXPECT_EQ(Model(cfg, 3, {.freeze_base = lora, .precision = pr}).activation_bytes(docs()),
                e.bytes);
    }
  }
}

// bf16 halves exactly the activation entries, so the bf16 plan is strictly smaller but more than
// half of the fp32 one (the fp32 entries stay).
TEST(Bf16Plan, Bf16PlanIsBetweenHalfAndAllOfTheFp32Plan) {
  const ModelConfig cfg = config(true);
  const size_t b = Model(cfg, 3, {.precision = Precision::bf16()}).activation_bytes(docs());
  const size_t f = Model(cfg, 3, {}).activation_bytes(docs());
  EXPECT_LT(b, f);
  EXPECT_GT(2 * b, f);
}

// Parameters under bf16: the policy's dtype, except the router's selection bias (a buffer) and
// the KDA decay parameters the gate kernel reads in fp32.
TEST(Bf16Plan, ParametersTheKernelsReadInFp32StayFp32) {
  ModelConfig cfg = config(true);
  cfg.moe.selection_bias = true;
  int f32 = 0;
  for (const NamedSpec& s : model_param_specs(cfg, Precision::bf16())) {
    const std::string& n = s.name;
    const bool keep =
        n.ends_with(".A_log") || n.ends_with(".dt_bias") || n.ends_with(".e_score_correction_bias");
    EXPECT_EQ(s.spec.dtype, keep ? DType::F32 : DType::BF16) << n;
    f32 += keep;
  }
  EXPECT_EQ(f32, 3 * 2 + 4);  // 3 KDA layers x (A_log, dt_bias), 4 MoE layers' biases
  Model m(cfg, 5, {.precision = Precision::bf16()});
  for (const auto& p : m.params().all()) EXPECT_EQ(p->value.dtype(), p->spec.dtype) << p->name;
}

}  // namespace
}  // namespace mt::test
