// The vision-tower ops (kimi_k25 / MoonViT) against the double references of tests/ref/vision_ref.h
// and finite differences: GELU (erf and tanh), the bias add, the patch embedding, the
// interpolated position embeddings, the axial 2-D RoPE, bidirectional attention inside each
// image (the attention op over full_indices), the 2x2 patch merge, and the row scatter that puts
// the image rows in place of the placeholder embeddings.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "harness/op_check.h"
#include "harness/seed.h"
#include "ops/attention.h"
#include "ops/bias.h"
#include "ops/elementwise.h"
#include "ops/gelu.h"
#include "ops/patch_embed.h"
#include "ops/patch_merge.h"
#include "ops/pos_embed.h"
#include "ops/rope2d.h"
#include "ops/row_scatter.h"
#include "ops/vision_grid.h"
#include "ref/vision_ref.h"

namespace mt::test {
namespace {

using Grids = std::vector<ops::ImageGrid>;

ref::Grids ref_grids(const Grids& g) {
  ref::Grids r;
  for (const ops::ImageGrid& x : g) r.push_back({x.rows, x.cols});
  return r;
}

std::string grid_name(const Grids& g) {
  std::string s;
  for (const ops::ImageGrid& x : g) s += cat(" ", x.rows, "x", x.cols);
  return s;
}

class GeluCase : public OpCase {
 public:
  GeluCase(ops::GeluKind kind, Shape s) : kind_(kind), shape_(std::move(s)) {}
  std::string name() const override {
    return cat(kind_ == ops::GeluKind::Tanh ? "gelu_tanh" : "gelu_erf", shape_);
  }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "x", .shape = shape_, .scale = 2.5}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc(shape_);
    ops::gelu_forward(ctx, kind_, in[0], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::gelu_backward(ctx, kind_, in[0], dout[0], grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::gelu(in[0], kind_ == ops::GeluKind::Tanh)};
  }

 private:
  ops::GeluKind kind_;
  Shape shape_;
};

TEST(VisionOps, GeluTanh) {
  GeluCase c(ops::GeluKind::Tanh, {37, 29});
  check_op(c);
}

TEST(VisionOps, GeluErf) {
  GeluCase c(ops::GeluKind::Erf, {5, 3, 41});
  check_op(c);
}

// y = x + b: x is copied into the output, then the bias op adds in place.
class BiasCase : public OpCase {
 public:
  BiasCase(int64_t rows, int64_t n) : rows_(rows), n_(n) {}
  std::string name() const override { return cat("bias_add ", rows_, "x", n_); }
  std::vector<InputSpec> inputs() const override {
    return {{.name = "x", .shape = {rows_, n_}}, {.name = "b", .shape = {n_}, .accumulate = true}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({rows_, n_});
    ops::copy(ctx, in[0], y);
    ops::bias_add_forward(ctx, in[1], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>&,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::copy(ctx, dout[0], grads[0]);
    ops::bias_add_backward(ctx, dout[0], grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::bias_add(in[0], in[1])};
  }

 private:
  int64_t rows_, n_;
};

TEST(VisionOps, BiasAdd) {
  BiasCase c(53, 19);
  check_op(c);
}

class PatchEmbedCase : public OpCase {
 public:
  PatchEmbedCase(ops::PatchEmbedParams p, bool flat_pixels, bool train_pixels)
      : p_(p), flat_(flat_pixels), train_px_(train_pixels) {}
  std::string name() const override {
    return cat("patch_embed N", p_.patches, " C", p_.channels, " P", p_.patch, " D", p_.hidden,
               flat_ ? " flat" : " 4d");
  }
  std::vector<InputSpec> inputs() const override {
    const Shape px = flat_ ? Shape{p_.patches, p_.patch_dim()}
                           : Shape{p_.patches, p_.channels, p_.patch, p_.patch};
    return {{.name = "pixels", .shape = px, .differentiable = train_px_},
            {.name = "w",
             .shape = {p_.hidden, p_.channels, p_.patch, p_.patch},
             .accumulate = true,
             .scale = 0.2},
            {.name = "b", .shape = {p_.hidden}, .accumulate = true}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({p_.patches, p_.hidden});
    ops::patch_embed_forward(ctx, p_, in[0], in[1], in[2], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::patch_embed_backward(ctx, p_, in[0], in[1], dout[0], grads[0], grads[1], grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::patch_embed(in[0], in[1], in[2], p_.patches, p_.channels, p_.patch, p_.hidden)};
  }

 private:
  ops::PatchEmbedParams p_;
  bool flat_, train_px_;
};

TEST(VisionOps, PatchEmbed) {
  PatchEmbedCase c({.patches = 23, .channels = 3, .patch = 5, .hidden = 17}, false, true);
  check_op(c);
}

TEST(VisionOps, PatchEmbedFlatPixelsNoPixelGrad) {
  PatchEmbedCase c({.patches = 9, .channels = 2, .patch = 3, .hidden = 11}, true, false);
  check_op(c);
}

class PosEmbedCase : public OpCase {
 public:
  PosEmbedCase(Grids g, int64_t R, int64_t Cc, int64_t D, ops::PosInterp mode)
      : grids_(std::move(g)),
        p_({.patches = ops::total_patches(grids_),
            .table_rows = R,
            .table_cols = Cc,
            .dim = D,
            .mode = mode}) {
    idx_ = Tensor::empty({p_.patches, p_.taps()}, DType::I32);
    wts_ = Tensor::empty({p_.patches, p_.taps()});
    ops::pos_embed_taps(p_, grids_, idx_, wts_);
  }
  std::string name() const override {
    return cat("pos_embed ", p_.mode == ops::PosInterp::Bicubic ? "bicubic" : "bilinear", " table ",
               p_.table_rows, "x", p_.table_cols, " D", p_.dim, grid_name(grids_));
  }
  std::vector<InputSpec> inputs() const override {
    Tensor idx = idx_, wts = wts_;
    return {{.name = "x", .shape = {p_.patches, p_.dim}},
            {.name = "table", .shape = {p_.table_rows, p_.table_cols, p_.dim}, .accumulate = true},
            {.name = "idx",
             .shape = idx_.shape(),
             .dtype = DType::I32,
             .differentiable = false,
             .init = [idx](Rng&, Tensor& t) { t.copy_from(idx); }},
            {.name = "wts",
             .shape = wts_.shape(),
             .differentiable = false,
             .init = [wts](Rng&, Tensor& t) { t.copy_from(wts); }}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({p_.patches, p_.dim});
    ops::pos_embed_forward(ctx, p_, in[2], in[3], in[1], in[0], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::copy(ctx, dout[0], grads[0]);
    ops::pos_embed_backward(ctx, p_, in[2], in[3], dout[0], grads[1]);
  }
  // The reference resamples the table itself; the tap tables are not read.
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::pos_embed(in[0], in[1], ref_grids(grids_), p_.table_rows, p_.table_cols, p_.dim,
                           p_.mode == ops::PosInterp::Bicubic)};
  }

 private:
  Grids grids_;
  ops::PosEmbedParams p_;
  Tensor idx_, wts_;
};

TEST(VisionOps, PosEmbedBicubicUpDownAndSameSize) {
  // Upsampled on both axes, downsampled on both, the table's own size, one row.
  PosEmbedCase c({{9, 11}, {3, 4}, {6, 5}, {1, 7}}, 6, 5, 7, ops::PosInterp::Bicubic);
  check_op(c);
}

TEST(VisionOps, PosEmbedBilinear) {
  PosEmbedCase c({{8, 3}, {2, 10}}, 4, 4, 9, ops::PosInterp::Bilinear);
  check_op(c);
}

// At the table's own size the resampling is the identity (weights exactly 1 and 0).
TEST(VisionOps, PosEmbedAtTableSizeIsTheTable) {
  const ops::PosEmbedParams p{
      .patches = 20, .table_rows = 4, .table_cols = 5, .dim = 3, .mode = ops::PosInterp::Bicubic};
  Tensor idx = Tensor::empty({20, 16}, DType::I32), wts = Tensor::empty({20, 16});
  ops::pos_embed_taps(p, {{4, 5}}, idx, wts);
  Context ctx;
  Rng rng(test_seed());
  Tensor table = Tensor::empty({4, 5, 3});
  fill_normal(rng, table);
  Tensor x = Tensor::zeros({20, 3}), y = Tensor::empty({20, 3});
  ops::pos_embed_forward(ctx, p, idx, wts, table, x, y);
  for (int64_t i = 0; i < 60; ++i) EXPECT_FLOAT_EQ(y.f32()[i], table.f32()[i]) << i;
}

class Rope2dCase : public OpCase {
 public:
  Rope2dCase(Grids g, int64_t H, int64_t Dh, float theta)
      : grids_(std::move(g)),
        p_({.tokens = ops::total_patches(grids_), .heads = H, .head_dim = Dh, .theta = theta}) {}
  std::string name() const override {
    return cat("rope2d H", p_.heads, " Dh", p_.head_dim, " theta", p_.theta, grid_name(grids_));
  }
  std::vector<InputSpec> inputs() const override {
    Tensor pos = ops::patch_positions(grids_);
    return {{.name = "x", .shape = {p_.tokens, p_.heads, p_.head_dim}},
            {.name = "positions",
             .shape = {p_.tokens, 2},
             .dtype = DType::I32,
             .differentiable = false,
             .init = [pos](Rng&, Tensor& t) { t.copy_from(pos); }}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({p_.tokens, p_.heads, p_.head_dim});
    ops::rope2d_forward(ctx, p_, in[1], in[0], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::rope2d_backward(ctx, p_, in[1], dout[0], grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::rope2d(in[0], in[1], p_.tokens, p_.heads, p_.head_dim, p_.theta)};
  }

 private:
  Grids grids_;
  ops::Rope2dParams p_;
};

TEST(VisionOps, Rope2d) {
  Rope2dCase c({{5, 7}, {12, 3}}, 3, 16, 10000.f);
  check_op(c);
}

TEST(VisionOps, Rope2dSmallHeadOtherTheta) {
  Rope2dCase c({{4, 4}, {1, 9}, {30, 2}}, 2, 4, 100.f);
  check_op(c);
}

TEST(VisionOps, Rope2dInPlaceMatchesOutOfPlace) {
  const Grids g{{6, 5}};
  const ops::Rope2dParams p{.tokens = 30, .heads = 2, .head_dim = 8};
  Context ctx;
  Rng rng(test_seed());
  Tensor x = Tensor::empty({30, 2, 8});
  fill_normal(rng, x);
  Tensor pos = ops::patch_positions(g), y = Tensor::empty({30, 2, 8}), z = x.clone();
  ops::rope2d_forward(ctx, p, pos, x, y);
  ops::rope2d_forward(ctx, p, pos, z, z);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(y.f32()[i], z.f32()[i]) << i;
}

// Bidirectional attention inside each image: the index-list attention op over full_indices,
// checked against a dense per-image softmax that never sees an index list.
class FullAttentionCase : public OpCase {
 public:
  FullAttentionCase(std::vector<int64_t> lengths, int64_t H, int64_t Dh)
      : lengths_(std::move(lengths)), seq_(SeqInfo::from_lengths(lengths_)) {
    p_ = {.tokens = seq_.tokens,
          .heads = H,
          .qk_dim = Dh,
          .v_dim = Dh,
          .kmax = ops::max_doc_len(seq_),
          .scale = 1.f / std::sqrt(static_cast<float>(Dh))};
  }
  std::string name() const override {
    std::string s = cat("full_attention H", p_.heads, " Dh", p_.qk_dim, " images");
    for (int64_t l : lengths_) s += cat(" ", l);
    return s;
  }
  std::vector<InputSpec> inputs() const override {
    const std::vector<int64_t> lengths = lengths_;
    return {{.name = "q", .shape = {p_.tokens, p_.heads, p_.qk_dim}, .scale = 1.5},
            {.name = "k", .shape = {p_.tokens, p_.heads, p_.qk_dim}},
            {.name = "v", .shape = {p_.tokens, p_.heads, p_.v_dim}},
            {.name = "indices",
             .shape = {p_.tokens, p_.kmax},
             .dtype = DType::I32,
             .differentiable = false,
             .init = [lengths](Rng&, Tensor& t) {
               ops::full_indices(SeqInfo::from_lengths(lengths), t);
             }}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"o"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    o_ = alloc({p_.tokens, p_.heads, p_.v_dim});
    lse_ = alloc({p_.tokens, p_.heads});
    ops::attention_forward(ctx, p_, in[0], in[1], in[2], in[3], o_, lse_);
    return {o_};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::attention_backward(ctx, p_, in[0], in[1], in[2], in[3], o_, lse_, dout[0], grads[0],
                            grads[1], grads[2]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::full_attention(in[0], in[1], in[2], seq_.offsets, p_.heads, p_.qk_dim, p_.scale)};
  }

 private:
  std::vector<int64_t> lengths_;
  SeqInfo seq_;
  ops::AttentionParams p_;
  Tensor o_, lse_;
};

TEST(VisionOps, FullAttentionPackedImages) {
  FullAttentionCase c({20, 1, 35, 6}, 3, 8);
  check_op(c);
}

TEST(VisionOps, FullIndicesListWholeImage) {
  const SeqInfo seq = SeqInfo::from_lengths({3, 2});
  Tensor idx = Tensor::empty({5, 4}, DType::I32);
  ops::full_indices(seq, idx);
  const std::vector<int32_t> want{0, 1,  2, -1, 0,  1,  2, -1, 0,  1,
                                  2, -1, 3, 4,  -1, -1, 3, 4,  -1, -1};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(idx.i32()[i], want[i]) << i;
  Tensor small = Tensor::empty({5, 2}, DType::I32);
  EXPECT_THROW(ops::full_indices(seq, small), ShapeError);
}

class PatchMergeCase : public OpCase {
 public:
  PatchMergeCase(Grids g, int64_t kh, int64_t kw, int64_t D)
      : grids_(std::move(g)),
        kh_(kh),
        kw_(kw),
        p_({.patches = ops::total_patches(grids_), .dim = D}) {}
  std::string name() const override {
    return cat("patch_merge ", kh_, "x", kw_, " D", p_.dim, grid_name(grids_));
  }
  std::vector<InputSpec> inputs() const override {
    Tensor order = ops::merge_order(grids_, kh_, kw_);
    return {{.name = "x", .shape = {p_.patches, p_.dim}},
            {.name = "order",
             .shape = {p_.patches},
             .dtype = DType::I32,
             .differentiable = false,
             .init = [order](Rng&, Tensor& t) { t.copy_from(order); }}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({p_.patches, p_.dim});
    ops::patch_merge_forward(ctx, p_, in[1], in[0], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::patch_merge_backward(ctx, p_, in[1], dout[0], grads[0]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::patch_merge(in[0], ref_grids(grids_), kh_, kw_, p_.dim)};
  }

 private:
  Grids grids_;
  int64_t kh_, kw_;
  ops::PatchMergeParams p_;
};

TEST(VisionOps, PatchMerge2x2) {
  PatchMergeCase c({{4, 6}, {2, 2}, {8, 4}}, 2, 2, 5);
  check_op(c);
}

TEST(VisionOps, PatchMergeNonSquareKernel) {
  PatchMergeCase c({{3, 4}, {6, 2}}, 3, 2, 3);
  check_op(c);
}

// The image rows replace the placeholders' embeddings: the op gets the placeholder positions,
// the reference only the token ids (a mask, as transformers' masked_scatter).
class RowScatterCase : public OpCase {
 public:
  RowScatterCase(int64_t T, int64_t D, uint64_t seed) : T_(T), D_(D) {
    Rng rng(seed);
    for (int64_t t = 0; t < T; ++t) {
      const bool image = rng.uniform() < 0.4;
      ids_.push_back(image ? kImageToken : static_cast<int32_t>(rng.uniform() * 100));
      if (image) rows_.push_back(static_cast<int32_t>(t));
    }
  }
  std::string name() const override {
    return cat("row_scatter T", T_, " D", D_, " placeholders ", rows_.size());
  }
  std::vector<InputSpec> inputs() const override {
    const std::vector<int32_t> rows = rows_;
    const int64_t K = static_cast<int64_t>(rows_.size());
    return {{.name = "embeds", .shape = {T_, D_}},
            {.name = "src", .shape = {K, D_}},
            {.name = "index",
             .shape = {K},
             .dtype = DType::I32,
             .differentiable = false,
             .init = [rows](Rng&, Tensor& t) {
               for (size_t k = 0; k < rows.size(); ++k) t.i32()[k] = rows[k];
             }}};
  }
  std::vector<OutputSpec> outputs() const override { return {{"y"}}; }
  std::vector<Tensor> forward(Context& ctx, GuardedAlloc& alloc,
                              const std::vector<Tensor>& in) override {
    Tensor y = alloc({T_, D_});
    ops::copy(ctx, in[0], y);
    ops::row_scatter_forward(ctx, params(), in[2], in[1], y);
    return {y};
  }
  void backward(Context& ctx, GuardedAlloc&, const std::vector<Tensor>& in,
                const std::vector<Tensor>& dout, std::vector<Tensor>& grads) override {
    ops::copy(ctx, dout[0], grads[0]);
    ops::row_scatter_backward(ctx, params(), in[2], grads[0], grads[1]);
  }
  std::vector<DVec> reference(const std::vector<DVec>& in) const override {
    return {ref::masked_scatter(in[0], ids_, kImageToken, in[1], D_)};
  }

 private:
  static constexpr int32_t kImageToken = 1000;
  ops::RowScatterParams params() const {
    return {.rows = static_cast<int64_t>(rows_.size()), .dst_rows = T_, .dim = D_};
  }
  int64_t T_, D_;
  std::vector<int32_t> ids_, rows_;
};

TEST(VisionOps, RowScatterPlaceholders) {
  RowScatterCase c(41, 13, std::random_device{}());
  check_op(c);
}

TEST(VisionOps, BadInputsAreNamedErrors) {
  Context ctx;
  // A grid the merge kernel does not tile.
  EXPECT_THROW(ops::merge_order({{4, 4}, {3, 4}}, 2, 2), ValueError);
  // A video clip (time axis) is refused by name.
  try {
    ops::grids_from_thw({{1, 4, 4}, {2, 4, 4}});
    ADD_FAILURE() << "video grid accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(e.message().find("video"), std::string::npos) << e.message();
  }
  // A head the axial rotation cannot split into four.
  Tensor pos = Tensor::zeros({2, 2}, DType::I32), x = Tensor::zeros({2, 1, 6});
  EXPECT_THROW(ops::rope2d_forward(ctx, {.tokens = 2, .heads = 1, .head_dim = 6}, pos, x, x),
               ValueError);
  // A merge order that is not a permutation.
  Tensor order = Tensor::zeros({3}, DType::I32), a = Tensor::zeros({3, 2}),
         b = Tensor::zeros({3, 2});
  EXPECT_THROW(ops::patch_merge_forward(ctx, {.patches = 3, .dim = 2}, order, a, b), ValueError);
  // A position tap outside the table.
  const ops::PosEmbedParams pp{
      .patches = 1, .table_rows = 2, .table_cols = 2, .dim = 2, .mode = ops::PosInterp::Bilinear};
  Tensor idx = Tensor::zeros({1, 4}, DType::I32), w = Tensor::zeros({1, 4}),
         tab = Tensor::zeros({2, 2, 2}), px = Tensor::zeros({1, 2}), py = Tensor::zeros({1, 2});
  idx.i32()[2] = 4;
  EXPECT_THROW(ops::pos_embed_forward(ctx, pp, idx, w, tab, px, py), ValueError);
  // A placeholder row named twice.
  Tensor rows = Tensor::zeros({2}, DType::I32), src = Tensor::zeros({2, 2}),
         dst = Tensor::zeros({4, 2});
  EXPECT_THROW(ops::row_scatter_forward(ctx, {.rows = 2, .dst_rows = 4, .dim = 2}, rows, src, dst),
               ValueError);
  // Pixels that do not match the patch size.
  Tensor pix = Tensor::zeros({2, 3, 4, 4}), pw = Tensor::zeros({5, 3, 5, 5}),
         pb = Tensor::zeros({5}), pe = Tensor::zeros({2, 5});
  EXPECT_THROW(ops::patch_embed_forward(ctx, {.patches = 2, .channels = 3, .patch = 5, .hidden = 5},
                                        pix, pw, pb, pe),
               ShapeError);
}

}  // namespace
}  // namespace mt::test
