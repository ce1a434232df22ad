// DistTrainer, part: the ZeRO optimizer step. Gradient reductions of every unit are posted, then
// completed in order; the global norm clips; AdamW runs on this rank's shard; the shards are
// gathered back (fsdp units keep the shard: the next use gathers it).
#include <cmath>
#include <cstring>

#include "model/moe_layer.h"
#include "ops/optim.h"
#include "parallel/dist_unit.h"
#include "parallel/fsdp.h"

namespace mt::par {

namespace {

void pack(const std::vector<Param*>& ps, bool grads, float* dst) {
  for (const Param* p : ps) {
    const Tensor& t = grads ? p->grad : p->value;
    std::memcpy(dst, t.f32(), t.bytes());
    dst += t.numel();
  }
}

void unpack(const float* src, const std::vector<Param*>& ps) {
  for (Param* p : ps) {
    std::memcpy(p->value.f32(), src, p->value.bytes());
    src += p->value.numel();
  }
}

double sum_sq(const Tensor& t) {
  double s = 0;
  const float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}

void scale(Tensor& t, float a) {
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= a;
}

}  // namespace

double DistTrainer::optimizer_step(Context& ctx, float lr, double grad_scale) {
  // Post every unit's gradient reduction, then complete them in order.
  const auto gs = static_cast<float>(grad_scale / mesh_.world);
  if (fsdp_) fsdp_->finish();
  for (auto& u : units_) {
    if (u->fsdp >= 0) {  // already reduce-scattered, unit by unit, during backward
      u->gshard = fsdp_->grad_shard(u->fsdp, u->part);
      continue;
    }
    pack(u->params, true, u->gflat.f32());  // the padding stays zero from the constructor
    if (u->sharded) {
      u->req = u->comm->ireduce_scatter(u->gflat.raw(), u->gshard.raw(), u->shard, Elem::F32);
    } else {
      u->req = u->comm->iall_reduce(u->gflat.raw(), u->padded, Elem::F32);
    }
  }
  double sq = 0;
  for (auto& u : units_) {
    u->req.wait();
    scale(u->gshard, gs);
    if (u->counts_norm) sq += sum_sq(u->gshard);
  }
  const double norm = std::sqrt(g_.world->all_reduce_sum(sq));
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
    for (auto& u : units_) scale(u->gshard, c);
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
    pack(u->params, false, pflat.f32());
    std::memset(pflat.f32() + u->n, 0, static_cast<size_t>(u->padded - u->n) * sizeof(float));
    if (u->sharded) {
      const int64_t b = u->comm->rank() * u->shard;
      Tensor mine = mine_.rows(0, u->shard);
      std::memcpy(mine.f32(), pflat.f32() + b, static_cast<size_t>(u->shard) * sizeof(float));
      ops::adamw_step(ctx, hp, mine, u->gshard, u->m, u->v);
      u->req = u->comm->iall_gather(mine.raw(), u->shard, pflat.raw(), Elem::F32);
      u->req.wait();
    } else {
      ops::adamw_step(ctx, hp, pflat, u->gshard, u->m, u->v);
    }
    unpack(pflat.f32(), u->params);
  }

  update_router_biases(ctx);

  metrics_ = {};
  metrics_.world = g_.world->stats();
  metrics_.ep = g_.ep->stats();
  metrics_.edp = g_.edp->stats();
  for (auto& e : ep_) metrics_.rows_received += e->rows_received();
  return norm;
}

}  // namespace mt::par
