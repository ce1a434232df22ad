#include "ops/pos_embed.h"

#include <cmath>

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_common(const PosEmbedParams& p, const Tensor& idx, const Tensor& wts) {
  MT_CHECK(p.patches >= 0 && p.table_rows > 0 && p.table_cols > 0 && p.dim > 0, ValueError,
           "pos_embed: bad params patches ", p.patches, " table ", p.table_rows, "x", p.table_cols,
           " dim ", p.dim);
  expect_shape(idx, {p.patches, p.taps()}, "pos_embed idx");
  MT_CHECK(idx.dtype() == DType::I32, ShapeError, "pos_embed idx must be i32, got ",
           dtype_name(idx.dtype()));
  expect_shape(wts, {p.patches, p.taps()}, "pos_embed wts");
}

// Table rows are read (forward) and written (backward) at these indices: refuse any outside it.
void check_idx(const PosEmbedParams& p, const Tensor& idx) {
  const int32_t* pi = idx.i32();
  const int64_t n = idx.numel(), rows = p.table_rows * p.table_cols;
  for (int64_t i = 0; i < n; ++i)
    MT_CHECK(pi[i] >= 0 && pi[i] < rows, ValueError, "pos_embed idx[", i / p.taps(), ", ",
             i % p.taps(), "] = ", pi[i], " is outside the table's ", rows, " rows");
}

// Taps into a table axis of `side` entries for target index i of an axis of `size`, as
// F.interpolate(align_corners=False) places them.
void axis_taps(PosInterp mode, int64_t i, int64_t size, int64_t side, int32_t* taps, double* w) {
  const double src =
      (static_cast<double>(i) + 0.5) * static_cast<double>(side) / static_cast<double>(size) - 0.5;
  const double fl = std::floor(src);
  const int first = mode == PosInterp::Bicubic ? -1 : 0;
  const int n = mode == PosInterp::Bicubic ? 4 : 2;
  for (int k = 0; k < n; ++k) {
    const int64_t raw = static_cast<int64_t>(fl) + first + k;
    taps[k] = static_cast<int32_t>(raw < 0 ? 0 : (raw >= side ? side - 1 : raw));
    const double d = std::abs(src - fl - (first + k));
    if (mode == PosInterp::Bilinear) {
      w[k] = d < 1.0 ? 1.0 - d : 0.0;
    } else {
      const double a = -0.75;
      w[k] = d <= 1.0 ? ((a + 2) * d - (a + 3)) * d * d + 1
                      : ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
    }
  }
}

}  // namespace

void pos_embed_taps(const PosEmbedParams& p, const std::vector<ImageGrid>& grids, Tensor& idx,
                    Tensor& wts) {
  MT_CHECK(total_patches(grids) == p.patches, ValueError, "pos_embed_taps: grids hold ",
           total_patches(grids), " patches, params say ", p.patches);
  check_common(p, idx, wts);
  MT_CHECK(idx.device() == Device::CPU && wts.device() == Device::CPU, ValueError,
           "pos_embed_taps fills host tensors");
  const int n = p.mode == PosInterp::Bicubic ? 4 : 2;
  int32_t* pi = idx.i32();
  float* pw = wts.f32();
  int32_t rt[4], ct[4];
  double rw[4], cw[4];
  for (const ImageGrid& g : grids)
    for (int64_t r = 0; r < g.rows; ++r) {
      axis_taps(p.mode, r, g.rows, p.table_rows, rt, rw);
      for (int64_t c = 0; c < g.cols; ++c) {
        axis_taps(p.mode, c, g.cols, p.table_cols, ct, cw);
        for (int a = 0; a < n; ++a)
          for (int b = 0; b < n; ++b) {
            *pi++ = static_cast<int32_t>(rt[a] * p.table_cols + ct[b]);
            *pw++ = static_cast<float>(rw[a] * cw[b]);
          }
      }
    }
}

void pos_embed_forward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                       const Tensor& table, const Tensor& x, Tensor& y) {
  check_common(p, idx, wts);
  expect_shape(table, {p.table_rows, p.table_cols, p.dim}, "pos_embed table");
  expect_shape(x, {p.patches, p.dim}, "pos_embed x");
  expect_shape(y, {p.patches, p.dim}, "pos_embed y");
  if (auto* cuda = cuda_body(MT_OP_BODIES(pos_embed_forward), {&idx, &wts, &table, &x, &y}))
    return cuda(ctx, p, idx, wts, table, x, y);
  check_idx(p, idx);
  cpu::pos_embed_forward(ctx, p, idx, wts, table, x, y);
}

void pos_embed_backward(Context& ctx, const PosEmbedParams& p, const Tensor& idx, const Tensor& wts,
                        const Tensor& dy, Tensor& dtable) {
  check_common(p, idx, wts);
  expect_shape(dy, {p.patches, p.dim}, "pos_embed dy");
  expect_shape(dtable, {p.table_rows, p.table_cols, p.dim}, "pos_embed dtable");
  if (auto* cuda = cuda_body(MT_OP_BODIES(pos_embed_backward), {&idx, &wts, &dy, &dtable}))
    return cuda(ctx, p, idx, wts, dy, dtable);
  check_idx(p, idx);
  cpu::pos_embed_backward(ctx, p, idx, wts, dy, dtable);
}

}  // namespace mt::ops
