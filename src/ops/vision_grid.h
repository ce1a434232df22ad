// How the patches of several images are packed for the vision tower: image after image, each in
// raster order (row-major over its patch grid), as transformers' kimi_k25 processor emits them.
// These host helpers turn the list of grids into what the vision ops read: one attention
// document per image, the (row, col) of every patch, and the order of the 2x2 (in general
// kh x kw) spatial merge. Images only: a time axis (video) is refused where grids are made.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/seq_info.h"
#include "core/tensor.h"

namespace mt::ops {

struct ImageGrid {
  int64_t rows = 0, cols = 0;  // patches down and across
  int64_t patches() const { return rows * cols; }
};

// Grids from transformers' grid_thw rows (t, h, w); t != 1 (a video clip) is a ValueError.
std::vector<ImageGrid> grids_from_thw(const std::vector<std::array<int64_t, 3>>& thw);

// Total patches; ValueError for an empty list or an empty grid.
int64_t total_patches(const std::vector<ImageGrid>& grids);
// ValueError naming the image unless its rows and cols are multiples of the merge kernel.
void check_mergeable(const std::vector<ImageGrid>& grids, int64_t kh, int64_t kw);

// One document per image: attention never crosses from one image to another.
SeqInfo image_seq(const std::vector<ImageGrid>& grids);
// i32 [patches, 2]: (row, col) of every patch inside its image.
Tensor patch_positions(const std::vector<ImageGrid>& grids);
// i32 [patches]: the spatial-merge gather. Slot s = m * kh * kw + (i * kw + j) of the merged
// sequence holds patch (kh * mr + i, kw * mc + j) of merged token m = (mr, mc) of its image
// (merged tokens raster-ordered, image after image).
Tensor merge_order(const std::vector<ImageGrid>& grids, int64_t kh, int64_t kw);

}  // namespace mt::ops
