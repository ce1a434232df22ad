// Random packed documents for the model-level tests: a batch to run forward and backward on.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "train/dataset.h"

namespace mt::test {

// Documents of the given lengths with token ids and targets uniform over [0, vocab). In every
// period of mask_every positions the middle one's target is -100 (kIgnoreIndex: prompt tokens,
// padding), so the loss's masking is always exercised; target_tokens counts the others.
Batch random_batch(Rng& rng, int64_t vocab, const std::vector<int64_t>& lengths,
                   int64_t mask_every);

}  // namespace mt::test
