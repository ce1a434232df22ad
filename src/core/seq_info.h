// How the tokens of a step are packed: documents laid end to end ("varlen"), with cumulative
// offsets. Recurrent state, convolutions and attention never cross a document boundary, and
// positions restart at 0 in each document.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt {

struct SeqInfo {
  int64_t tokens = 0;
  int64_t num_seqs = 0;
  // The tensors the ops read live on the step's device (a GPU step stages them there,
  // train/device_batch.h); the host keeps what host-side arithmetic reads (KDA's saved-state rows,
  // loops over documents), so a GPU step never reads them back.
  Tensor cu_seqlens;             // i32 [num_seqs + 1]: cu[0] = 0, cu[num_seqs] = tokens
  Tensor positions;              // i32 [tokens]: position of each token inside its document
  Tensor cu_seqlens_host;        // cu_seqlens in host memory (the same tensor on the CPU)
  std::vector<int64_t> offsets;  // host copy of cu_seqlens, for loops over documents

  // Documents of the given lengths (each > 0), packed in order.
  static SeqInfo from_lengths(const std::vector<int64_t>& lengths);
  // `batch` documents of `seq_len` tokens each.
  static SeqInfo uniform(int64_t batch, int64_t seq_len) {
    return from_lengths(std::vector<int64_t>(static_cast<size_t>(batch), seq_len));
  }
};

inline SeqInfo SeqInfo::from_lengths(const std::vector<int64_t>& lengths) {
  SeqInfo s;
  s.num_seqs = static_cast<int64_t>(lengths.size());
  s.offsets.push_back(0);
  for (int64_t l : lengths) {
    MT_CHECK(l > 0, ValueError, "document length must be positive, got ", l);
    s.offsets.push_back(s.offsets.back() + l);
  }
  s.tokens = s.offsets.back();
  s.cu_seqlens = Tensor::empty({s.num_seqs + 1}, DType::I32);
  s.positions = Tensor::empty({s.tokens}, DType::I32);
  for (int64_t i = 0; i <= s.num_seqs; ++i)
    s.cu_seqlens.i32()[i] = static_cast<int32_t>(s.offsets[i]);
  for (int64_t d = 0; d < s.num_seqs; ++d)
    for (int64_t t = s.offsets[d]; t < s.offsets[d + 1]; ++t)
      s.positions.i32()[t] = static_cast<int32_t>(t - s.offsets[d]);
  s.cu_seqlens_host = s.cu_seqlens;
  return s;
}

}  // namespace mt
