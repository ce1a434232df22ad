// DistTrainer, part: gradient buckets of the units FSDP does not own (the dense units without
// FSDP, the routed experts without ZeRO-3), planned once and posted during backward.
#include <algorithm>

#include "ops/elementwise.h"
#include "parallel/dist_unit.h"

namespace mt::par {

void DistTrainer::plan_buckets() {
  std::vector<Unit*> order;
  for (auto& u : units_) {
    if (u->fsdp >= 0) continue;
    u->final_after = model_.num_units();
    for (const Param* p : u->params) u->final_after = std::min(u->final_after, model_unit(*p));
    order.push_back(u.get());
  }
  // Backward finishes the units from the head down; equal ranks keep store order, so every rank
  // builds the same buckets and posts them in the same order.
  std::stable_sort(order.begin(), order.end(),
                   [](const Unit* a, const Unit* b) { return a->final_after > b->final_after; });
  const auto limit = static_cast<int64_t>(std::max(opt_.bucket_mib, 0.0) * (1 << 20));
  for (Unit* u : order) {
    Bucket* b = buckets_.empty() ? nullptr : &buckets_.back();
    if (!b || b->comm != u->comm || b->sharded != u->sharded ||
        b->cols * (b->sharded ? b->comm->size() : 1) * 4 >= limit) {
      buckets_.emplace_back();
      b = &buckets_.back();
      b->comm = u->comm;
      b->sharded = u->sharded;
    }
    u->bucket = static_cast<int>(buckets_.size()) - 1;
    u->col = b->cols;
    b->cols += u->sharded ? u->shard : u->padded;
    b->ready_after = u->final_after;  // the lowest so far: the order is descending
    b->units.push_back(u);
  }
  for (Bucket& b : buckets_) {
    const int64_t rows = b.sharded ? b.comm->size() : 1;
    b.flat = Tensor::zeros({rows * b.cols}, DType::F32, dev_);
    b.reduced = b.sharded ? Tensor::zeros({b.cols}, DType::F32, dev_) : b.flat;
    for (Unit* u : b.units)
      u->gshard = b.reduced.rows(u->col, u->col + (u->sharded ? u->shard : u->padded));
  }
  if (buckets_.empty()) return;
  bucket_hooks_ = std::make_unique<BucketHooks>(*this, fsdp_.get());
  model_.set_unit_hooks(bucket_hooks_.get());
}

void DistTrainer::pack_bucket(Context& ctx, Bucket& b) {
  for (const Unit* u : b.units) {
    // Flat element i of the unit sits in row i / len, column col + i % len of the bucket
    // (len: its shard, or all of it when unsharded). The padding is never written: zero.
    const int64_t len = u->sharded ? u->shard : u->padded;
    int64_t o = 0;
    for (const Param* p : u->params) {
      const int64_t n = p->grad.numel();
      const Tensor g = p->grad.view({n});
      for (int64_t i = o; i < o + n;) {
        const int64_t c = i % len, k = std::min(len - c, o + n - i);
        const int64_t at = (i / len) * b.cols + u->col + c;
        Tensor dst = b.flat.rows(at, at + k);
        ops::copy(ctx, g.rows(i - o, i - o + k), dst);
        i += k;
      }
      o += n;
    }
  }
}

void DistTrainer::post_bucket(Context& ctx, Bucket& b) {
  pack_bucket(ctx, b);
  b.req = b.sharded ? b.comm->ireduce_scatter(b.flat.raw(), b.reduced.raw(), b.cols, Elem::F32)
                    : b.comm->iall_reduce(b.flat.raw(), b.cols, Elem::F32);
  b.posted = true;
}

void DistTrainer::unit_backward_done(int u) {
  // Only the micro-batch that ends the accumulation has final gradients.
  if (micro_ != opt_.micro_batches - 1 || !step_ctx_) return;
  for (Bucket& b : buckets_)
    if (!b.posted && b.ready_after >= u) post_bucket(*step_ctx_, b);
}

void DistTrainer::BucketHooks::poke() {
  for (Bucket& b : trainer.buckets_) b.req.test();
}

void DistTrainer::BucketHooks::before_forward(int u) {
  poke();
  if (inner) inner->before_forward(u);
}

void DistTrainer::BucketHooks::after_forward(int u) {
  if (inner) inner->after_forward(u);
}

void DistTrainer::BucketHooks::before_backward(int u) {
  poke();
  if (inner) inner->before_backward(u);
}

void DistTrainer::BucketHooks::after_backward(int u) {
  if (inner) inner->after_backward(u);
  trainer.unit_backward_done(u);
}

}  // namespace mt::par
