#include "model/vision/vision_batch.h"

#include "ops/attention.h"

namespace mt {

VisionBatch VisionBatch::from_grids(const std::vector<ops::ImageGrid>& grids) {
  VisionBatch b;
  b.grids = grids;
  b.seq = ops::image_seq(grids);
  b.positions = ops::patch_positions(grids);
  b.kmax = ops::max_doc_len(b.seq);
  b.indices = Tensor::empty({b.seq.tokens, b.kmax}, DType::I32);
  ops::full_indices(b.seq, b.indices);
  return b;
}

}  // namespace mt
