#include "train/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "decode/decode.h"

namespace mt {

void check_sampling(const SamplingOptions& opt) {
  MT_CHECK(opt.max_new >= 0, ValueError, "generate: max_new ", opt.max_new,
           " must not be negative");
  MT_CHECK(opt.temperature >= 0.f && std::isfinite(opt.temperature), ValueError,
           "generate: temperature ", opt.temperature, " must be >= 0");
  MT_CHECK(opt.top_p > 0.f && opt.top_p <= 1.f, ValueError, "generate: top_p ", opt.top_p,
           " must be in (0, 1]");
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, Rng& rng) {
  MT_CHECK(vocab > 0, ValueError, "generate: empty vocabulary");
  if (opt.temperature == 0.f)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  // Probabilities in double: a float softmax of sharp logits loses the tail top-p cuts at.
  const double inv_t = 1.0 / opt.temperature;
  const double m = *std::max_element(logits, logits + vocab);
  std::vector<double> p(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += p[i] = std::exp((logits[i] - m) * inv_t);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  // The nucleus: the shortest prefix of the sorted ids whose mass reaches top_p.
  size_t keep = 0;
  double mass = 0;
  while (keep < order.size()) {
    mass += p[order[keep++]] / sum;
    if (mass >= opt.top_p) break;
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[order[i]];
  double u = rng.uniform() * kept;
  for (size_t i = 0; i < keep; ++i) {
    u -= p[order[i]];
    if (u < 0) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> Generator::generate(Context& ctx, const std::vector<int32_t>& prompt,
                                         const SamplingOptions& opt,
                                         const std::function<void(int32_t)>& on_token) {
  check_sampling(opt);
  const int64_t V = model_.config().vocab, P = static_cast<int64_t>(prompt.size());
  MT_CHECK(P > 0, ValueError, "generate: the prompt is empty");
  for (int64_t i = 0; i < P; ++i)
    MT_CHECK(prompt[i] >= 0 && prompt[i] < V, ValueError, "generate: prompt token ", i, " is id ",
             prompt[i], ", outside the vocabulary of ", V);
  Decoder dec(model_, P + std::max<int64_t>(opt.max_new, 1));
  Rng rng(opt.seed);
  Tensor ids = Tensor::empty({P}, DType::I32);
  std::copy(prompt.begin(), prompt.end(), ids.i32());
  // Only the last row's logits are needed: the decoder runs the LM head on it alone.
  Tensor row = Tensor::empty({1, V});
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  dec.step(ctx, ids, row);
  const auto t1 = Clock::now();
  stats_ = {.prompt_tokens = P, .prompt_seconds = std::chrono::duration<double>(t1 - t0).count()};
  std::vector<int32_t> out;
  Tensor one = Tensor::empty({1}, DType::I32);
  for (int64_t i = 0; i < opt.max_new; ++i) {
    const int32_t tok = sample_token(row.f32(), V, opt, rng);
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (tok == opt.eos || i + 1 == opt.max_new) break;
    one.i32()[0] = tok;
    dec.step(ctx, one, row);
  }
  stats_.generated = static_cast<int64_t>(out.size());
  stats_.decode_steps = stats_.generated > 0 ? stats_.generated - 1 : 0;
  stats_.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return out;
}

}  // namespace mt
