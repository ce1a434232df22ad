// What every block of the vision tower reads about one batch of packed images, built once per
// step from the images' patch grids: one attention document per image (bidirectional inside it,
// nothing across), the (row, col) of every patch for the 2-D RoPE, the full index lists the
// attention op walks, the position-embedding taps and the merge order.
#pragma once

#include <vector>

#include "core/seq_info.h"
#include "core/tensor.h"
#include "ops/pos_embed.h"
#include "ops/vision_grid.h"

namespace mt {

struct VisionBatch {
  std::vector<ops::ImageGrid> grids;
  SeqInfo seq;       // one document per image
  Tensor positions;  // i32 [T, 2]
  int64_t kmax = 0;  // longest image
  Tensor indices;    // i32 [T, kmax]: ops::full_indices
  int64_t tokens() const { return seq.tokens; }

  static VisionBatch from_grids(const std::vector<ops::ImageGrid>& grids);
};

}  // namespace mt
