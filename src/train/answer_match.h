// Exact-match accuracy of answers: for a prompt/answer task (the image-text demo's questions),
// an answer is the target tokens of one document segment, and it counts as correct when greedy
// decoding from its prompt would reproduce every one of them. Under teacher forcing that is the
// arg-max of the logits at each target position equalling the target: greedy decoding follows
// the answer exactly as long as every arg-max does, and leaves it at the first one that does not.
// Ties go to the lower token id.
#pragma once

#include <cstdint>

#include "core/context.h"
#include "model/model.h"
#include "train/dataset.h"
#include "train/trainer.h"

namespace mt {

struct AnswerMatch {
  int64_t answers = 0, correct = 0;
  double accuracy() const {
    return answers > 0 ? static_cast<double>(correct) / static_cast<double>(answers) : 0;
  }
};

// Over the first `max_sequences` sequences of `data` (0 = all), `batch` at a time, through
// `exec` (which runs `model` on `ctx`). Segments without targets (padding, prompts) are skipped.
AnswerMatch answer_exact_match(StepExecutor& exec, Model& model, Context& ctx,
                               const PackedData& data, int64_t batch, int64_t max_sequences);

}  // namespace mt
