// Decoding through the feed-forward blocks: they are per token, so a decode step is their
// training forward over the new rows, its saved activations in the caller's throw-away arena.
#include <utility>

#include "model/dense_ffn.h"
#include "model/moe_layer.h"

namespace mt {

namespace {

// Puts a value back when the scope ends, a throw included.
template <class T>
class Restore {
 public:
  explicit Restore(T& slot) : slot_(slot), kept_(slot) {}
  ~Restore() { slot_ = std::move(kept_); }
  Restore(const Restore&) = delete;
  Restore& operator=(const Restore&) = delete;

 private:
  T& slot_;
  T kept_;
};

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
  // The guards restore the counts however the forward ends: after a throw, load_dev_ must not
  // keep pointing at the scratch that `scope` frees (declared first, so it is released last).
  if (ctx.device() == Device::CPU) {
    Restore keep_load(load_);
    forward_rows(ctx, *this, seq, x, y, acts);
    return;
  }
  ArenaScope scope(ctx.workspace());
  Restore keep_dev(load_dev_);
  Restore keep_stale(load_stale_);
  load_dev_ = ctx.workspace().alloc({cfg_.num_experts}, DType::I64);
  forward_rows(ctx, *this, seq, x, y, acts);
}

void DenseFfn::decode_step(Context& ctx, const SeqInfo& seq, const Tensor& x, Tensor& y,
                           Arena& acts) {
  forward_rows(ctx, *this, seq, x, y, acts);
}

}  // namespace mt
