#include "ops/embedding.h"

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_shapes(const EmbeddingParams& p, const Tensor& ids, const Tensor& table) {
  expect_shape(ids, {p.tokens}, "embedding ids");
  expect_shape(table, {p.vocab, p.dim}, "embedding table");
}

// Validated up front and serially: an exception cannot leave an OpenMP region. Reads the ids, so
// it runs on the host path only.
void check_ids(const EmbeddingParams& p, const Tensor& ids) {
  const int32_t* id = ids.i32();
  for (int64_t t = 0; t < p.tokens; ++t)
    MT_CHECK(id[t] >= 0 && id[t] < p.vocab, ValueError, "embedding: token id ", id[t],
             " at position ", t, " is outside [0, ", p.vocab, ")");
}

}  // namespace

void embedding_forward(Context& ctx, const EmbeddingParams& p, const Tensor& ids,
                       const Tensor& table, Tensor& y) {
  check_shapes(p, ids, table);
  expect_shape(y, {p.tokens, p.dim}, "embedding output");
  if (auto* cuda = cuda_body(MT_OP_BODIES(embedding_forward), {&ids, &table, &y}))
    return cuda(ctx, p, ids, table, y);
  check_ids(p, ids);
  cpu::embedding_forward(ctx, p, ids, table, y);
}

void embedding_backward(Context& ctx, const EmbeddingParams& p, const Tensor& ids, const Tensor& dy,
                        Tensor& dtable) {
  check_shapes(p, ids, dtable);
  expect_shape(dy, {p.tokens, p.dim}, "embedding dy");
  if (auto* cuda = cuda_body(MT_OP_BODIES(embedding_backward), {&ids, &dy, &dtable}))
    return cuda(ctx, p, ids, dy, dtable);
  check_ids(p, ids);
  cpu::embedding_backward(ctx, p, ids, dy, dtable);
}

}  // namespace mt::ops
