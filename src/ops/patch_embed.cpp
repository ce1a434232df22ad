#include "ops/patch_embed.h"

#include "ops/bias.h"
#include "ops/gemm.h"

namespace mt::ops {

namespace {

// The 2-D view [rows, cols] of a contiguous tensor that holds exactly rows * cols elements laid
// out as one of the documented shapes.
Tensor as_matrix(const Tensor& t, int64_t rows, int64_t cols, const Shape& four_d,
                 const char* what) {
  if (t.ndim() == 4) {
    expect_shape(t, four_d, what);
  } else {
    expect_shape(t, {rows, cols}, what);
  }
  return t.view({rows, cols});
}

void check(const PatchEmbedParams& p) {
  MT_CHECK(p.patches >= 0 && p.channels > 0 && p.patch > 0 && p.hidden > 0, ValueError,
           "patch_embed: bad params patches ", p.patches, " channels ", p.channels, " patch ",
           p.patch, " hidden ", p.hidden);
}

}  // namespace

void patch_embed_forward(Context& ctx, const PatchEmbedParams& p, const Tensor& pixels,
                         const Tensor& w, const Tensor& b, Tensor& y) {
  check(p);
  const Tensor x = as_matrix(pixels, p.patches, p.patch_dim(),
                             {p.patches, p.channels, p.patch, p.patch}, "patch_embed pixels");
  const Tensor wm = as_matrix(w, p.hidden, p.patch_dim(), {p.hidden, p.channels, p.patch, p.patch},
                              "patch_embed weight");
  expect_shape(b, {p.hidden}, "patch_embed bias");
  expect_shape(y, {p.patches, p.hidden}, "patch_embed y");
  matmul(ctx, x, false, wm, true, y);
  bias_add_forward(ctx, b, y);
}

void patch_embed_backward(Context& ctx, const PatchEmbedParams& p, const Tensor& pixels,
                          const Tensor& w, const Tensor& dy, Tensor& dpixels, Tensor& dw,
                          Tensor& db) {
  check(p);
  const Shape px4{p.patches, p.channels, p.patch, p.patch};
  const Shape w4{p.hidden, p.channels, p.patch, p.patch};
  const Tensor x = as_matrix(pixels, p.patches, p.patch_dim(), px4, "patch_embed pixels");
  const Tensor wm = as_matrix(w, p.hidden, p.patch_dim(), w4, "patch_embed weight");
  expect_shape(dy, {p.patches, p.hidden}, "patch_embed dy");
  if (db.defined()) bias_add_backward(ctx, dy, db);
  if (dw.defined()) {
    Tensor dwm = as_matrix(dw, p.hidden, p.patch_dim(), w4, "patch_embed dw");
    matmul(ctx, dy, true, x, false, dwm, 1.0f, 1.0f);
  }
  if (dpixels.defined()) {
    Tensor dx = as_matrix(dpixels, p.patches, p.patch_dim(), px4, "patch_embed dpixels");
    matmul(ctx, dy, false, wm, false, dx);
  }
}

}  // namespace mt::ops
