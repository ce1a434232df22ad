// Element ops on the GPU: contiguous element-wise maps, and the strided copy / head expansion
// that split and join fused projections through cols() views.
#include "ops/cuda/common.cuh"
#include "ops/elementwise.h"

namespace mt::ops::cuda {

namespace {

constexpr int kMaxDims = 6;

// Shape and strides of a tensor, by value into a kernel: element i of the row-major index space
// lives at offset(i).
struct Layout {
  int nd = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  __device__ int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; --d) {
      off += (i % dims[d]) * strides[d];
      i /= dims[d];
    }
    return off;
  }
};

Layout layout(const Tensor& t) {
  MT_CHECK(t.ndim() <= kMaxDims, ShapeError, "strided CUDA copy supports up to ", kMaxDims,
           " dimensions, got ", t.shape());
  Layout l;
  l.nd = t.ndim();
  for (int d = 0; d < l.nd; ++d) {
    l.dims[d] = t.dim(d);
    l.strides[d] = t.stride(d);
  }
  return l;
}

// A tensor as rows of contiguous elements: `rows` rows of `cols`, `ld` elements apart, where its
// last dimension is contiguous and the ones before it merge into one (each stride the next's times
// its size; dimensions of size 1 merge whatever their stride). False otherwise.
struct Rows {
  int64_t rows = 0, cols = 0, ld = 0;
};
bool as_rows(const Tensor& t, Rows& r) {
  const int nd = t.ndim();
  if (nd == 0 || t.numel() == 0 || t.stride(nd - 1) != 1) return false;
  r.cols = t.dim(nd - 1);
  r.rows = t.numel() / r.cols;
  r.ld = r.cols;
  bool have_ld = false;  // the innermost row dimension of size > 1 sets the rows' pitch
  for (int d = nd - 2; d >= 0; --d) {
    if (t.dim(d) == 1) continue;
    if (!have_ld) {
      r.ld = t.stride(d);
      have_ld = true;
      continue;
    }
    int64_t inner = d + 1;  // the next dimension of size > 1
    while (t.dim(inner) == 1) ++inner;
    if (t.stride(d) != t.stride(inner) * t.dim(inner)) return false;
  }
  return true;
}

// dst's rows = src's rows, 16 bytes a thread (Index: 32-bit where the chunks allow, since 64-bit
// divisions per 16 bytes cost more than the bytes).
template <typename Index>
__global__ void copy_rows16_kernel(const uint4* src, int64_t lds, uint4* dst, int64_t ldd, Index n,
                                   Index per_row) {
  for (Index i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index r = i / per_row, c = i - r * per_row;
    dst[static_cast<int64_t>(r) * ldd + c] = src[static_cast<int64_t>(r) * lds + c];
  }
}

// The same-dtype copy of two row layouts of one shape (copy checked the shapes), where the rows'
// widths, pitches and bases allow whole 16-byte moves: true when it ran. The generic path moves an
// element a thread through every dimension's index arithmetic (session 23, call 8: the step's
// large bf16 copies, ~200 us each).
template <typename T>
bool copy_rows16(Context& ctx, const Tensor& src, Tensor& dst) {
  constexpr int64_t kPack = 16 / sizeof(T);
  Rows a, b;
  if (!as_rows(src, a) || !as_rows(dst, b) || !packs_fit<T>(a.cols, {src.raw(), dst.raw()}) ||
      a.ld % kPack != 0 || b.ld % kPack != 0)
    return false;
  const int64_t per_row = a.cols / kPack, n = a.rows * per_row;
  const auto* ps = static_cast<const uint4*>(src.raw());
  auto* pt = static_cast<uint4*>(dst.raw());
  constexpr int threads = 256;
  if (n < (int64_t{1} << 31))
    copy_rows16_kernel<uint32_t><<<blocks_for(n, threads), threads, 0, stream(ctx)>>>(
        ps, a.ld / kPack, pt, b.ld / kPack, static_cast<uint32_t>(n),
        static_cast<uint32_t>(per_row));
  else
    copy_rows16_kernel<int64_t><<<blocks_for(n, threads), threads, 0, stream(ctx)>>>(
        ps, a.ld / kPack, pt, b.ld / kPack, n, per_row);
  MT_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace

void add_into(Context& ctx, const Tensor& x, Tensor& acc) {
  expect_same_dtype("add_into", x, acc, "acc");
  MT_DISPATCH_FLOAT(x, "add_into", {
    map_elements<T, T, 2, 1>(
        ctx, x.numel(), {ptr<T>(acc), ptr<T>(x)}, {ptr<T>(acc)},
        [] __device__(const float(&a)[2], float(&b)[1]) { b[0] = a[0] + a[1]; });
  });
}

void scale(Context& ctx, const Tensor& x, float s, Tensor& y) {
  expect_same_dtype("scale", x, y, "y");
  MT_DISPATCH_FLOAT(x, "scale", {
    map_elements<T, T, 1, 1>(ctx, x.numel(), {ptr<T>(x)}, {ptr<T>(y)},
                             [s] __device__(const float(&a)[1], float(&b)[1]) { b[0] = s * a[0]; });
  });
}

void sigmoid_forward(Context& ctx, const Tensor& x, Tensor& y) {
  expect_same_dtype("sigmoid", x, y, "y");
  MT_DISPATCH_FLOAT(x, "sigmoid", {
    map_elements<T, T, 1, 1>(
        ctx, x.numel(), {ptr<T>(x)}, {ptr<T>(y)},
        [] __device__(const float(&a)[1], float(&b)[1]) { b[0] = sigm(a[0]); });
  });
}

void sigmoid_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  expect_same_dtype("sigmoid", y, dy, "dy");
  expect_same_dtype("sigmoid", y, dx, "dx");
  MT_DISPATCH_FLOAT(y, "sigmoid", {
    map_elements<T, T, 2, 1>(
        ctx, y.numel(), {ptr<T>(y), ptr<T>(dy)}, {ptr<T>(dx)},
        [] __device__(const float(&a)[2], float(&b)[1]) { b[0] = a[1] * a[0] * (1.f - a[0]); });
  });
}

void copy(Context& ctx, const Tensor& src, Tensor& dst) {
  const Layout ls = layout(src), lt = layout(dst);
  if (src.dtype() != dst.dtype()) {  // f32 <-> bf16, converted through float
    MT_DISPATCH_FLOAT(src, "copy", {
      const T* ps = ptr<T>(src);
      const auto same = [] __device__(const float(&a)[1], float(&b)[1]) { b[0] = a[0]; };
      if (src.is_contiguous() && dst.is_contiguous()) {  // in packs (map_elements)
        if (dst.dtype() == DType::F32)
          map_elements<T, float, 1, 1>(ctx, src.numel(), {ps}, {ptr<float>(dst)}, same);
        else
          map_elements<T, __nv_bfloat16, 1, 1>(ctx, src.numel(), {ps}, {ptr<__nv_bfloat16>(dst)},
                                               same);
        return;
      }
      if (dst.dtype() == DType::F32) {
        float* pt = ptr<float>(dst);
        for_each_index(ctx, src.numel(),
                       [=] __device__(int64_t i) { st(pt, lt.offset(i), ld(ps, ls.offset(i))); });
      } else {
        __nv_bfloat16* pt = ptr<__nv_bfloat16>(dst);
        for_each_index(ctx, src.numel(),
                       [=] __device__(int64_t i) { st(pt, lt.offset(i), ld(ps, ls.offset(i))); });
      }
    });
    return;
  }
  MT_DISPATCH_FLOAT(src, "copy", {
    if (copy_rows16<T>(ctx, src, dst)) return;
    const T* ps = ptr<T>(src);
    T* pt = ptr<T>(dst);
    for_each_index(ctx, src.numel(),
                   [=] __device__(int64_t i) { pt[lt.offset(i)] = ps[ls.offset(i)]; });
  });
}

void expand_heads_forward(Context& ctx, const Tensor& x, Tensor& y) {
  expect_same_dtype("expand_heads", x, y, "y");
  const int64_t H = y.dim(1), D = y.dim(2);
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1);
  const int64_t ys0 = y.stride(0), ys1 = y.stride(1), ys2 = y.stride(2);
  MT_DISPATCH_FLOAT(x, "expand_heads", {
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    for_each_index(ctx, y.numel(), [=] __device__(int64_t e) {
      const int64_t t = e / (H * D), h = (e / D) % H, i = e % D;
      py[t * ys0 + h * ys1 + i * ys2] = px[t * xs0 + i * xs1];
    });
  });
}

void expand_heads_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  expect_same_dtype("expand_heads", dy, dx, "dx");
  const int64_t H = dy.dim(1), D = dy.dim(2);
  const int64_t xs0 = dx.stride(0), xs1 = dx.stride(1);
  const int64_t ys0 = dy.stride(0), ys1 = dy.stride(1), ys2 = dy.stride(2);
  MT_DISPATCH_FLOAT(dy, "expand_heads", {
    const T* py = ptr<T>(dy);
    T* px = ptr<T>(dx);
    for_each_index(ctx, dx.numel(), [=] __device__(int64_t e) {
      const int64_t t = e / D, i = e % D;
      float s = 0.f;  // heads summed in order: deterministic
      for (int64_t h = 0; h < H; ++h) s += ld(py, t * ys0 + h * ys1 + i * ys2);
      st(px, t * xs0 + i * xs1, s);
    });
  });
}

}  // namespace mt::ops::cuda
