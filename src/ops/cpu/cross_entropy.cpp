#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "core/arena.h"
#include "ops/cpu/gemm.h"
#include "ops/gemm.h"

namespace mt::ops::cpu {

namespace {

// Tokens that carry a loss (targets were range-checked by the entry).
int64_t count_valid(const CrossEntropyParams& p, const Tensor& targets) {
  const int32_t* tg = targets.i32();
  int64_t valid = 0;
  for (int64_t t = 0; t < p.tokens; ++t) valid += tg[t] != p.ignore_index;
  return valid;
}

// logits[rows, vocab] = h[t0 : t0 + rows] w^T.
void chunk_logits(Context& ctx, const CrossEntropyParams& p, const Tensor& h, const Tensor& w,
                  int64_t t0, int64_t rows, float* logits) {
  cpu::gemm(ctx, false, true, rows, p.vocab, p.hidden, 1.f, h.f32() + t0 * p.hidden, p.hidden,
            w.f32(), p.hidden, 0.f, logits, p.vocab);
}

}  // namespace

void lm_head_cross_entropy_forward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                   const Tensor& w, const Tensor& targets, Tensor& lse,
                                   Tensor& loss) {
  const int64_t valid = count_valid(p, targets);
  const int32_t* tg = targets.i32();
  float* plse = lse.f32();
  const int64_t V = p.vocab, chunk = std::min(p.chunk_tokens, std::max<int64_t>(p.tokens, 1));
  ArenaScope scope(ctx.workspace());
  float* logits = ctx.workspace().alloc({chunk, V}).f32();
  double total = 0;
  for (int64_t t0 = 0; t0 < p.tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, p.tokens - t0);
    chunk_logits(ctx, p, h, w, t0, rows, logits);
    double part = 0;
#pragma omp parallel for num_threads(ctx.threads()) schedule(static) reduction(+ : part)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      if (tg[t] == p.ignore_index) {
        plse[t] = 0.f;
        continue;
      }
      const float* lr = logits + r * V;
      float mx = lr[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, lr[v]);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(lr[v] - mx));
      const double l = mx + std::log(s);
      plse[t] = static_cast<float>(l);
      part += l - lr[tg[t]];
    }
    total += part;
  }
  loss.f64()[0] = valid ? total / static_cast<double>(valid) : 0.0;
}

void lm_head_cross_entropy_backward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                    const Tensor& w, const Tensor& targets, const Tensor& lse,
                                    float dloss, Tensor& dh, Tensor& dw) {
  const int64_t valid = count_valid(p, targets);
  const bool want_dw = dw.defined();
  if (valid == 0) {
    dh.zero_();
    return;
  }
  const int32_t* tg = targets.i32();
  const float* plse = lse.f32();
  const int64_t V = p.vocab, D = p.hidden, chunk = std::min(p.chunk_tokens, p.tokens);
  const float scale = dloss / static_cast<float>(valid);
  ArenaScope scope(ctx.workspace());
  // Logits are recomputed chunk by chunk and overwritten in place by dlogits.
  float* g = ctx.workspace().alloc({chunk, V}).f32();
  for (int64_t t0 = 0; t0 < p.tokens; t0 += chunk) {
    const int64_t rows = std::min(chunk, p.tokens - t0);
    chunk_logits(ctx, p, h, w, t0, rows, g);
#pragma omp parallel for num_threads(ctx.threads()) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      float* gr = g + r * V;
      if (tg[t] == p.ignore_index) {
        for (int64_t v = 0; v < V; ++v) gr[v] = 0.f;
        continue;
      }
      const float l = plse[t];
      for (int64_t v = 0; v < V; ++v) gr[v] = scale * std::exp(gr[v] - l);
      gr[tg[t]] -= scale;
    }
    cpu::gemm(ctx, false, false, rows, D, V, 1.f, g, V, w.f32(), D, 0.f, dh.f32() + t0 * D, D);
    if (want_dw)
      cpu::gemm(ctx, true, false, V, D, rows, 1.f, g, V, h.f32() + t0 * D, D, 1.f, dw.f32(), D);
  }
}

void lm_head_logits(Context& ctx, const Tensor& h, const Tensor& w, Tensor& logits) {
  ops::matmul(ctx, h, false, w, true, logits);
}

}  // namespace mt::ops::cpu
