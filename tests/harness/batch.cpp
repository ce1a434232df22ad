#include "harness/batch.h"

namespace mt::test {

Batch random_batch(Rng& rng, int64_t vocab, const std::vector<int64_t>& lengths,
                   int64_t mask_every) {
  Batch b;
  b.seq = SeqInfo::from_lengths(lengths);
  b.ids = Tensor::empty({b.seq.tokens}, DType::I32);
  b.targets = Tensor::empty({b.seq.tokens}, DType::I32);
  for (int64_t t = 0; t < b.seq.tokens; ++t) {
    b.ids.i32()[t] = static_cast<int32_t>(rng.below(vocab));
    const bool masked = t % mask_every == mask_every / 2;
    b.targets.i32()[t] = masked ? kIgnoreIndex : static_cast<int32_t>(rng.below(vocab));
    b.target_tokens += !masked;
  }
  return b;
}

}  // namespace mt::test
