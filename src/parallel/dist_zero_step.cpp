// DistTrainer, part: the ZeRO optimizer step. The gradient buckets not yet posted in backward
// (dist_buckets.cpp) are posted, every reduction completes, the global norm clips, AdamW runs on
// this rank's shard, and the shards are gathered back (fsdp units keep the shard: the next use
// gathers it).
#include <cmath>

#include "model/moe_layer.h"
#include "ops/elementwise.h"
#include "ops/optim.h"
#include "parallel/dist_unit.h"
#include "parallel/fsdp.h"

namespace mt::par {

namespace {

// The params' values into consecutive elements of `flat`, and back: ops on the context's
// stream, so the same code packs host memory and device memory.
void pack(Context& ctx, const std::vector<Param*>& ps, const Tensor& flat) {
  int64_t o = 0;
  for (const Param* p : ps) {
    const int64_t n = p->value.numel();
    Tensor dst = flat.rows(o, o + n);
    ops::copy(ctx, p->value.view({n}), dst);
    o += n;
  }
}

void unpack(Context& ctx, const Tensor& flat, const std::vector<Param*>& ps) {
  int64_t o = 0;
  for (Param* p : ps) {
    const int64_t n = p->value.numel();
    Tensor dst = p->value.view({n});
    ops::copy(ctx, flat.rows(o, o + n), dst);
    o += n;
  }
}

}  // namespace

double DistTrainer::optimizer_step(Context& ctx, float lr, double grad_scale) {
  MT_CHECK(ctx.device() == dev_, ValueError, "optimizer step on ", device_name(ctx.device()),
           " for a model on ", device_name(dev_));
  // Buckets not posted during backward (the last micro-batch's, or all after an unplanned extra
  // micro-batch) go now; then every reduction completes.
  const auto gs = static_cast<float>(grad_scale / mesh_.world);
  if (fsdp_) {
    fsdp_->set_context(&ctx);
    fsdp_->finish();
  }
  for (Bucket& b : buckets_)
    if (!b.posted) post_bucket(ctx, b);
  for (Bucket& b : buckets_) {
    b.req.wait();
    b.posted = false;
  }
  // The norm's one read (on a GPU the step's synchronisation point, as the one-process
  // optimizer's): the shards' squares summed where they live, then over the world.
  norm_grads_.clear();
  for (auto& u : units_) {
    if (u->fsdp >= 0)  // already reduce-scattered, unit by unit, during backward
      u->gshard = fsdp_->grad_shard(u->fsdp, u->part);
    if (gs != 1.f) ops::scale(ctx, u->gshard, gs, u->gshard);
    if (u->counts_norm) norm_grads_.push_back(u->gshard);
  }
  ensure_scalar(norm_sq_, dev_);
  ops::grad_norm_sq(ctx, norm_grads_, norm_sq_);
  const double norm = std::sqrt(g_.world->all_reduce_sum(read_scalar(norm_sq_)));
  if (!std::isfinite(norm)) {
    // A NaN/Inf gradient on any rank reaches every rank's norm through the reductions, so all
    // ranks skip the same step: no update, the step's routing loads discarded.
    for (auto& u : units_)
      if (u->fsdp >= 0) u->gshard = Tensor();
    for (MoeLayer* m : model_.moe_layers())
      if (m) m->reset_expert_load();
    return norm;
  }
  const double clip = opt_.adam.clip_norm;
  if (clip > 0 && norm > clip) {
    // The same coefficient ops::clip_grad_norm applies on one process.
    const float c = static_cast<float>(clip / (norm + 1e-6));
    for (auto& u : units_) ops::scale(ctx, u->gshard, c, u->gshard);
  }

  ++step_;
  const ops::AdamWParams hp = opt_.adam.at(lr, step_);
  for (auto& u : units_) {
    if (u->fsdp >= 0) {  // the shard is the parameter; the next use gathers it
      ops::adamw_step(ctx, hp, fsdp_->train_shard(u->fsdp, u->part), u->gshard, u->m, u->v);
      u->gshard = Tensor();
      continue;
    }
    // One scratch for all units (the largest unit's size); the padding is zeroed so that the
    // padded tail of the shard steps from zero with a zero gradient, as it would in fresh memory.
    Tensor pflat = pflat_.rows(0, u->padded);
    pack(ctx, u->params, pflat);
    if (u->padded > u->n) pflat.rows(u->n, u->padded).zero_();
    if (u->sharded) {
      const int64_t b = u->comm->rank() * u->shard;
      Tensor mine = mine_.rows(0, u->shard);
      ops::copy(ctx, pflat.rows(b, b + u->shard), mine);
      ops::adamw_step(ctx, hp, mine, u->gshard, u->m, u->v);
      u->req = u->comm->iall_gather(mine.raw(), u->shard, pflat.raw(), Elem::F32);
      u->req.wait();
    } else {
      ops::adamw_step(ctx, hp, pflat, u->gshard, u->m, u->v);
    }
    unpack(ctx, pflat, u->params);
  }

  update_router_biases(ctx);

  metrics_ = {};
  for (Comm* c : {g_.world, g_.ep.get(), g_.edp.get()}) c->settle_stats();
  metrics_.world = g_.world->stats();
  metrics_.ep = g_.ep->stats();
  metrics_.edp = g_.edp->stats();
  for (auto& e : ep_) metrics_.rows_received += e->rows_received();
  return norm;
}

}  // namespace mt::par
