// Decoding through the feed-forward blocks: they are per token, so a decode step is their
// training forward over the new rows, with its saved activations in a throw-away arena.
#include <vector>

#include "model/dense_ffn.h"
#include "model/moe_layer.h"

namespace mt {

namespace {

template <class L>
void forward_rows(Context& ctx, L& layer, const Tensor& x, Tensor& y) {
  const SeqInfo seq = SeqInfo::uniform(1, x.dim(0));
  ArenaPlan plan;
  layer.plan_activations(seq, plan);
  Arena acts(plan.bytes(), ctx.device(), "decode ffn activations");
  typename L::Saved discarded;
  layer.forward(ctx, seq, x, y, acts, discarded);
}

}  // namespace

void MoeLayer::decode_step(Context& ctx, const Tensor& x, Tensor& y) {
  // Generated tokens must not count towards the load that drives the selection-bias update.
  std::vector<int64_t> load = expert_load();
  forward_rows(ctx, *this, x, y);
  set_expert_load(std::move(load));
}

void DenseFfn::decode_step(Context& ctx, const Tensor& x, Tensor& y) {
  forward_rows(ctx, *this, x, y);
}

}  // namespace mt
