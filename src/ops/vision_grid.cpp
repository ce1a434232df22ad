#include "ops/vision_grid.h"

namespace mt::ops {

std::vector<ImageGrid> grids_from_thw(const std::vector<std::array<int64_t, 3>>& thw) {
  std::vector<ImageGrid> grids;
  for (size_t i = 0; i < thw.size(); ++i) {
    MT_CHECK(thw[i][0] == 1, ValueError, "image ", i, ": grid_thw time axis t = ", thw[i][0],
             " (a video clip); only images (t = 1) are supported");
    grids.push_back({thw[i][1], thw[i][2]});
  }
  return grids;
}

int64_t total_patches(const std::vector<ImageGrid>& grids) {
  MT_CHECK(!grids.empty(), ValueError, "vision batch without images");
  int64_t n = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    MT_CHECK(grids[i].rows > 0 && grids[i].cols > 0, ValueError, "image ", i, ": empty grid ",
             grids[i].rows, "x", grids[i].cols);
    n += grids[i].patches();
  }
  return n;
}

void check_mergeable(const std::vector<ImageGrid>& grids, int64_t kh, int64_t kw) {
  MT_CHECK(kh > 0 && kw > 0, ValueError, "merge kernel ", kh, "x", kw, " must be positive");
  for (size_t i = 0; i < grids.size(); ++i)
    MT_CHECK(grids[i].rows % kh == 0 && grids[i].cols % kw == 0, ValueError, "image ", i,
             ": patch grid ", grids[i].rows, "x", grids[i].cols,
             " is not a multiple of the merge kernel ", kh, "x", kw);
}

SeqInfo image_seq(const std::vector<ImageGrid>& grids) {
  total_patches(grids);
  std::vector<int64_t> lengths;
  for (const ImageGrid& g : grids) lengths.push_back(g.patches());
  return SeqInfo::from_lengths(lengths);
}

Tensor patch_positions(const std::vector<ImageGrid>& grids) {
  Tensor pos = Tensor::empty({total_patches(grids), 2}, DType::I32);
  int32_t* p = pos.i32();
  for (const ImageGrid& g : grids)
    for (int64_t r = 0; r < g.rows; ++r)
      for (int64_t c = 0; c < g.cols; ++c) {
        *p++ = static_cast<int32_t>(r);
        *p++ = static_cast<int32_t>(c);
      }
  return pos;
}

Tensor merge_order(const std::vector<ImageGrid>& grids, int64_t kh, int64_t kw) {
  check_mergeable(grids, kh, kw);
  Tensor order = Tensor::empty({total_patches(grids)}, DType::I32);
  int32_t* o = order.i32();
  int64_t base = 0;
  for (const ImageGrid& g : grids) {
    for (int64_t mr = 0; mr < g.rows / kh; ++mr)
      for (int64_t mc = 0; mc < g.cols / kw; ++mc)
        for (int64_t i = 0; i < kh; ++i)
          for (int64_t j = 0; j < kw; ++j)
            *o++ = static_cast<int32_t>(base + (kh * mr + i) * g.cols + kw * mc + j);
    base += g.patches();
  }
  return order;
}

}  // namespace mt::ops
