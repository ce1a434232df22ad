#include "ops/cross_entropy.h"

#include "ops/dispatch.h"

namespace mt::ops {

namespace {

void check_shapes(const CrossEntropyParams& p, const Tensor& h, const Tensor& w,
                  const Tensor& targets) {
  MT_CHECK(p.tokens >= 0 && p.hidden > 0 && p.vocab > 0 && p.chunk_tokens > 0, ValueError,
           "cross_entropy: bad sizes tokens=", p.tokens, " hidden=", p.hidden, " vocab=", p.vocab,
           " chunk_tokens=", p.chunk_tokens);
  expect_shape(h, {p.tokens, p.hidden}, "cross_entropy h");
  expect_shape(w, {p.vocab, p.hidden}, "cross_entropy lm_head weight");
  expect_shape(targets, {p.tokens}, "cross_entropy targets");
}

// Reads the targets, so it runs on the host path only.
void check_targets(const CrossEntropyParams& p, const Tensor& targets) {
  const int32_t* tg = targets.i32();
  for (int64_t t = 0; t < p.tokens; ++t)
    MT_CHECK(tg[t] == p.ignore_index || (tg[t] >= 0 && tg[t] < p.vocab), ValueError,
             "cross_entropy: target ", tg[t], " at position ", t, " is outside [0, ", p.vocab,
             ") and is not ignore_index ", p.ignore_index);
}

}  // namespace

int64_t ce_chunk_tokens(Device device) {
  return device == Device::CUDA ? 1024 : 128;
}

void lm_head_cross_entropy_forward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                   const Tensor& w, const Tensor& targets, Tensor& lse,
                                   Tensor& loss) {
  check_shapes(p, h, w, targets);
  expect_shape(lse, {p.tokens}, "cross_entropy lse");
  expect_f64_scalar(loss, "cross_entropy loss");
  if (auto* cuda =
          cuda_body(MT_OP_BODIES(lm_head_cross_entropy_forward), {&h, &w, &targets, &lse, &loss}))
    return cuda(ctx, p, h, w, targets, lse, loss);
  check_targets(p, targets);
  cpu::lm_head_cross_entropy_forward(ctx, p, h, w, targets, lse, loss);
}

void lm_head_cross_entropy_backward(Context& ctx, const CrossEntropyParams& p, const Tensor& h,
                                    const Tensor& w, const Tensor& targets, const Tensor& lse,
                                    float dloss, Tensor& dh, Tensor& dw) {
  check_shapes(p, h, w, targets);
  expect_shape(lse, {p.tokens}, "cross_entropy lse");
  expect_shape(dh, {p.tokens, p.hidden}, "cross_entropy dh");
  if (dw.defined()) expect_shape(dw, {p.vocab, p.hidden}, "cross_entropy dw");
  if (auto* cuda = cuda_body(MT_OP_BODIES(lm_head_cross_entropy_backward),
                             {&h, &w, &targets, &lse, &dh, &dw}))
    return cuda(ctx, p, h, w, targets, lse, dloss, dh, dw);
  check_targets(p, targets);
  cpu::lm_head_cross_entropy_backward(ctx, p, h, w, targets, lse, dloss, dh, dw);
}

void lm_head_cross_entropy_forward_backward(Context& ctx, const CrossEntropyParams& p,
                                            const Tensor& h, const Tensor& w, const Tensor& targets,
                                            float dloss, Tensor& lse, Tensor& loss, Tensor& dh) {
  check_shapes(p, h, w, targets);
  expect_shape(lse, {p.tokens}, "cross_entropy lse");
  expect_f64_scalar(loss, "cross_entropy loss");
  expect_shape(dh, {p.tokens, p.hidden}, "cross_entropy dh");
  // No CPU body of its own (the two passes below), so no OpBodies.
  if (op_device("lm_head_cross_entropy_forward_backward", {&h, &w, &targets, &lse, &loss, &dh}) ==
      Device::CUDA) {
#if MOETRAIN_WITH_CUDA
    return cuda::lm_head_cross_entropy_forward_backward(ctx, p, h, w, targets, dloss, lse, loss,
                                                        dh);
#else
    no_cuda_backend("lm_head_cross_entropy_forward_backward");
#endif
  }
  // The CPU computes the logits chunk by chunk in either pass anyway: the two passes in a row.
  check_targets(p, targets);
  Tensor no_dw;
  cpu::lm_head_cross_entropy_forward(ctx, p, h, w, targets, lse, loss);
  cpu::lm_head_cross_entropy_backward(ctx, p, h, w, targets, lse, dloss, dh, no_dw);
}

void lm_head_logits(Context& ctx, const Tensor& h, const Tensor& w, Tensor& logits) {
  MT_CHECK(h.ndim() == 2 && w.ndim() == 2 && h.dim(1) == w.dim(1), ShapeError, "lm_head_logits: h ",
           h.shape(), " and lm_head weight ", w.shape(), " need the same hidden size");
  expect_shape(logits, {h.dim(0), w.dim(0)}, "lm_head_logits logits");
  dispatch(MT_OP_BODIES(lm_head_logits), {&h, &w, &logits}, ctx, h, w, logits);
}

}  // namespace mt::ops
