// Decoding through the feed-forward blocks: they are per token, so a decode step is their
// training forward over the new rows, its saved activations in the caller's throw-away arena.
#include "model/dense_ffn.h"
#include "model/moe_layer.h"

namespace mt {

namespace {

template <class L>
void forward_rows(Context& ctx, L& layer, const SeqInfo& seq, const Tensor& x, Tensor& y,
                  Arena& acts) {
  ArenaPlan plan(x.dtype(), ctx.device());
  layer.plan_activations(seq, plan);
  // Grown, never shrunk: the prompt's step sizes it for the single tokens after it.
  if (acts.capacity() < plan.bytes())
    acts = Arena(plan.bytes(), ctx.device(), "decode ffn activations");
  acts.reset();
  typename L::Saved discarded;
  layer.forward(ctx, seq, x, y, acts, discarded);
}

}  // namespace

void MoeLayer::decode_step(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y,
                           Arena& acts) {
  // Generated tokens must not count towards the load that drives the selection-bias update. The
  // forward counts into load_ (host) or load_dev_ (GPU): the host count is restored afterwards,
  // the device count is swapped for a scratch one, so that no step reads the device.
  if (ctx.device() == Device::CPU) {
    std::vector<int64_t> load = load_;
    forward_rows(ctx, *this, seq, x, y, acts);
    load_ = std::move(load);
    return;
  }
  ArenaScope scope(ctx.workspace());
  Tensor kept = load_dev_;
  const bool stale = load_stale_;
  load_dev_ = ctx.workspace().alloc({cfg_.num_experts}, DType::I64);
  forward_rows(ctx, *this, seq, x, y, acts);
  load_dev_ = kept;
  load_stale_ = stale;
}

void DenseFfn::decode_step(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y,
                           Arena& acts) {
  forward_rows(ctx, *this, seq, x, y, acts);
}

}  // namespace mt
