// Incremental decoding (inference only, no backward): a Decoder feeds a model the tokens of one
// document a few at a time (a whole prompt, then one token per step) and returns their logits,
// carrying per-layer state instead of recomputing the prefix:
// - KDA: the recurrent state S [H, K, K] and, per short convolution (q, k, v), the projections of
//   the last kernel-1 tokens (the conv's tail), zero at the document start like the varlen conv.
// - MLA / DSA: a KV cache of per-head keys (after RoPE) and values, [capacity, H, Dqk] and
//   [capacity, H, Dv]. Per-head k/v rather than the compressed latent: it costs H·(Dqk+Dv) floats
//   per token instead of kv_lora_rank + rope, but the attention over the cache needs no
//   re-expansion through kv_b_proj at each step. DSA also caches the indexer key (after its
//   LayerNorm and RoPE), [capacity, DI], and selects the top-k of the cached causal positions.
// - Dense FFN / MoE: per token, nothing is carried.
// Capacity is fixed when the Decoder is built (memory is planned, never grown); feeding past it
// is a ValueError.
//
// Devices: the Decoder runs where the model's parameters live (Model::to_device), its state and
// caches next to them, in the model's activation dtype (the KDA state fp32), every step through op
// entries only, so one code path serves the CPU and the GPU. A step stages its host-built inputs
// (ids, positions, offsets) to the device in one copy and copies the logits back in one copy: on a
// GPU these are the step's synchronisation points, with the MoE layers' read of their dispatch
// offsets (docs/gpu.md, "Synchronisation points").
//
// The layers' decode_step methods run their projections through the layers' own modules, so
// they overwrite what a training forward saved for backward: do not decode between a forward and
// its backward.
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "core/context.h"
#include "core/seq_info.h"
#include "core/tensor.h"

namespace mt {

class Model;

struct DecoderOptions {
  // A prompt runs KDA's chunked core (its per-chunk products pay off over many tokens); a few
  // tokens run the recurrence, which reads and writes the state once. 0: always the chunked core
  // (for comparisons: `moetrain bench decode`).
  int64_t kda_recurrent_max = 16;
};

// What every layer of one step reads, on the model's device, staged once per step.
struct DecodeInputs {
  Tensor ids;      // i32 [n]
  SeqInfo seq;     // the n new tokens as one document; positions = their absolute positions
  Tensor cu_conv;  // i32 [2] = {0, conv tail + n}: the short convolution's document
  // KDA: steps of at most this many tokens run the per-token recurrence (ops::kda_recurrent_step),
  // longer ones the chunked core; the Decoder copies it from its DecoderOptions.
  int64_t kda_recurrent_max = DecoderOptions{}.kda_recurrent_max;
};

struct KdaDecodeState {
  Tensor state;                   // [1, H, K, K] f32
  Tensor q_tail, k_tail, v_tail;  // [kernel - 1, H*K] projections of the previous tokens
};

struct AttnDecodeState {
  int64_t len = 0;  // cached tokens (= position of the next token)
  int64_t capacity = 0;
  Tensor k, v;     // [capacity, H, Dqk], [capacity, H, Dv]
  Tensor index_k;  // DSA only: [capacity, DI]
};

class Decoder {
 public:
  // State for documents of up to max_tokens tokens, on the model's device; the model must
  // outlive the decoder and stay on that device.
  Decoder(Model& model, int64_t max_tokens, const DecoderOptions& opt = {});

  // Back to an empty document (states zeroed, caches emptied).
  void reset();
  // Feeds ids (host i32 [n], n >= 1, continuing the current document); writes host f32 logits
  // [n, vocab], or [1, vocab]: the last token's only (the LM head then runs on that row alone).
  // ctx must be on the model's device.
  void step(Context& ctx, const Tensor& ids, Tensor& logits);

  int64_t position() const { return pos_; }
  int64_t capacity() const { return max_tokens_; }
  // Token rows pushed through the layers since construction (prefix rows are never recomputed,
  // so after a prompt of P tokens and G single-token steps this is P + G).
  int64_t rows_computed() const { return rows_; }

 private:
  Model& model_;
  int64_t max_tokens_;
  int64_t pos_ = 0;
  int64_t rows_ = 0;
  DecoderOptions opt_;
  std::vector<KdaDecodeState> kda_;    // per layer (unused entries for other kinds)
  std::vector<AttnDecodeState> attn_;  // per layer
  Tensor staged_host_, staged_;        // i32 [2 * max_tokens + 4]: ids | positions | offsets
  Arena ffn_acts_;                     // the FFN forwards' throw-away activations
};

}  // namespace mt
