#include "train/answer_match.h"

#include <algorithm>
#include <vector>

#include "ops/gemm.h"

namespace mt {

namespace {

// Rows of logits formed at once: bounds the workspace to kRows x vocab floats.
constexpr int64_t kRows = 128;

// The arg-max token of every row of final_h x head^T, on the host.
std::vector<int32_t> greedy_tokens(Context& ctx, const Tensor& final_h, const Tensor& head) {
  const int64_t T = final_h.dim(0), V = head.dim(0);
  std::vector<int32_t> out(static_cast<size_t>(T));
  Tensor logits = Tensor::empty({std::min(T, kRows), V}, DType::F32, ctx.device());
  for (int64_t r0 = 0; r0 < T; r0 += kRows) {
    const int64_t n = std::min(kRows, T - r0);
    Tensor l = logits.rows(0, n);
    ops::matmul(ctx, final_h.rows(r0, r0 + n), false, head, true, l);
    const Tensor host = l.device() == Device::CPU ? l : l.to(Device::CPU);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = host.f32() + i * V;
      out[static_cast<size_t>(r0 + i)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
  }
  return out;
}

}  // namespace

AnswerMatch answer_exact_match(StepExecutor& exec, Model& model, Context& ctx,
                               const PackedData& data, int64_t batch, int64_t max_sequences) {
  MT_CHECK(batch > 0, ValueError, "exact match: batch must be positive, got ", batch);
  const Param* head = model.params().find(
      model.config().tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  MT_CHECK(head != nullptr, InternalError, "model has no LM head weight");
  const int64_t n =
      max_sequences > 0 ? std::min(max_sequences, data.sequences()) : data.sequences();
  AnswerMatch m;
  for (int64_t s = 0; s < n; s += batch) {
    std::vector<int64_t> idx;
    for (int64_t k = s; k < std::min(n, s + batch); ++k) idx.push_back(k);
    const Batch b = make_batch(data, idx);
    if (b.target_tokens == 0) continue;
    exec.forward_loss(b);
    const std::vector<int32_t> got = greedy_tokens(ctx, model.final_hidden(), head->value);
    const int32_t* tgt = b.targets.i32();
    for (size_t d = 0; d + 1 < b.seq.offsets.size(); ++d) {
      bool any = false, all = true;
      for (int64_t t = b.seq.offsets[d]; t < b.seq.offsets[d + 1]; ++t)
        if (tgt[t] != kIgnoreIndex) {
          any = true;
          all &= got[static_cast<size_t>(t)] == tgt[t];
        }
      if (!any) continue;
      ++m.answers;
      m.correct += all ? 1 : 0;
    }
  }
  return m;
}

}  // namespace mt
