// Embedding lookup and its gradient on the GPU. The backward adds the rows of equal ids in token
// order without atomics, so it is deterministic; it scans the ids once per token (quadratic in
// the token count), which is the direct version: a sort by id replaces it when it shows up in a
// profile.
#include "ops/cuda/common.cuh"
#include "ops/embedding.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void embedding_fwd_kernel(int64_t tokens, int64_t vocab, int64_t dim, const int32_t* ids,
                                     const T* table, T* y, int32_t* bad) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0 || id >= vocab) {
    if (threadIdx.x == 0) atomicCAS(bad, -1, static_cast<int32_t>(t));  // first bad position
    return;
  }
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    st(y + t * dim, d, ld(table + static_cast<int64_t>(id) * dim, d));
}

// One block per token; dtable rows of repeated ids are added by the token that comes first, in
// token order, so the result does not depend on scheduling.
template <typename T>
__global__ void embedding_bwd_kernel(int64_t tokens, int64_t dim, const int32_t* ids, const T* dy,
                                     float* dtable) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  for (int64_t u = 0; u < t; ++u)
    if (ids[u] == id) return;  // an earlier token owns this row
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float s = 0.f;
    for (int64_t u = t; u < tokens; ++u)
      if (ids[u] == id) s += ld(dy + u * dim, d);
    dtable[static_cast<int64_t>(id) * dim + d] += s;
  }
}

}  // namespace

void embedding_forward(Context& ctx, const EmbeddingParams& p, const Tensor& ids,
                       const Tensor& table, Tensor& y) {
  expect_same_dtype("embedding", table, y, "y");
  if (p.tokens == 0) return;
  ArenaScope scope(ctx.workspace());
  Tensor bad = ctx.workspace().alloc({1}, DType::I32);
  MT_CUDA_CHECK(cudaMemsetAsync(bad.raw(), 0xff, sizeof(int32_t), stream(ctx)));
  MT_DISPATCH_FLOAT(table, "embedding", {
    embedding_fwd_kernel<T><<<static_cast<unsigned>(p.tokens), kThreads, 0, stream(ctx)>>>(
        p.tokens, p.vocab, p.dim, ptr<int32_t>(ids), ptr<T>(table), ptr<T>(y), ptr<int32_t>(bad));
  });
  MT_CUDA_LAUNCH_CHECK();
  // The CPU op reports an out-of-range id by position; so does this one, at the cost of one
  // 4-byte device-to-host copy (listed among the step's synchronisation points).
  int32_t first_bad = -1;
  MT_CUDA_CHECK(
      cudaMemcpyAsync(&first_bad, bad.raw(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream(ctx)));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream(ctx)));
  if (first_bad >= 0) {
    int32_t id = 0;
    MT_CUDA_CHECK(
        cudaMemcpy(&id, ptr<int32_t>(ids) + first_bad, sizeof(int32_t), cudaMemcpyDeviceToHost));
    MT_THROW(ValueError, "embedding: token id ", id, " at position ", first_bad,
             " is outside the vocabulary [0, ", p.vocab, ")");
  }
}

void embedding_backward(Context& ctx, const EmbeddingParams& p, const Tensor& ids, const Tensor& dy,
                        Tensor& dtable) {
  expect_f32("embedding", dtable, "dtable");
  if (p.tokens == 0) return;
  MT_DISPATCH_FLOAT(dy, "embedding", {
    embedding_bwd_kernel<T><<<static_cast<unsigned>(p.tokens), kThreads, 0, stream(ctx)>>>(
        p.tokens, p.dim, ptr<int32_t>(ids), ptr<T>(dy), ptr<float>(dtable));
  });
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::cuda
