#include "parallel/fsdp.h"

#include <algorithm>
#include <cstring>

namespace mt::par {

namespace {

int64_t numel_of(const Param& p) {
  return p.spec.shape.numel();
}

void add_into(const Tensor& part, Tensor& acc) {
  const float* s = part.f32();
  float* d = acc.f32();
  for (int64_t i = 0; i < part.numel(); ++i) d[i] += s[i];
}

}  // namespace

Fsdp::Fsdp(Model& model, Comm& comm, std::vector<FsdpUnitSpec> units)
    : model_(model), comm_(comm), units_(units.size()) {
  MT_CHECK(static_cast<int>(units.size()) == model.num_units(), InternalError,
           "fsdp: ", units.size(), " unit specs for a model of ", model.num_units(), " units");
  const int64_t W = comm.size(), r = comm.rank();
  for (size_t u = 0; u < units.size(); ++u) {
    Unit& un = units_[u];
    un.train.params = std::move(units[u].train);
    un.frozen.params = std::move(units[u].frozen);
    std::vector<Tensor> fulls;  // the packed values, viewed by the layer until this unit is bound
    for (Group* g : {&un.train, &un.frozen}) {
      for (const Param* p : g->params) {
        MT_CHECK(p->value.shape() == p->spec.shape, InternalError, "fsdp: parameter ", p->name,
                 " is ", p->value.shape(), ", declared ", p->spec.shape);
        g->n += numel_of(*p);
      }
      g->padded = (g->n + W - 1) / W * W;
      g->shard_len = g->padded / W;
      if (g->n == 0) continue;
      Tensor full = Tensor::zeros({g->padded});
      int64_t off = 0;
      for (Param* p : g->params) {
        std::memcpy(full.f32() + off, p->value.f32(), p->value.bytes());
        p->value = Tensor(full.f32() + off, p->spec.shape, DType::F32);
        p->grad = Tensor();
        off += numel_of(*p);
      }
      g->shard = full.rows(r * g->shard_len, (r + 1) * g->shard_len).clone();
      mem_.shard_bytes += static_cast<int64_t>(g->shard.bytes());
      fulls.push_back(full);
    }
    un.grad_shard = Tensor::zeros({std::max<int64_t>(un.train.shard_len, 1)});
    if (un.train.n > 0) mem_.grad_bytes += static_cast<int64_t>(un.grad_shard.bytes());
    // Rebinding drops the layer's owning references, so the full tensors die with `fulls`.
    model_.rebind_unit(static_cast<int>(u));
    for (Group* g : {&un.train, &un.frozen})
      for (Param* p : g->params) p->value = Tensor();
  }
  model_.set_unit_hooks(this);
}

Fsdp::~Fsdp() {
  model_.set_unit_hooks(nullptr);
  try {
    finish();
  } catch (...) {
    // A failed collective already surfaced to the step; the job is ending.
  }
}

bool Fsdp::owns(const Param* p) const {
  for (const Unit& un : units_)
    for (const Group* g : {&un.train, &un.frozen})
      if (std::find(g->params.begin(), g->params.end(), p) != g->params.end()) return true;
  return false;
}

void Fsdp::track(int64_t bytes) {
  mem_.transient_now += bytes;
  mem_.transient_peak = std::max(mem_.transient_peak, mem_.transient_now);
}

void Fsdp::poke() {
  for (Unit& un : units_) {
    un.train.req.test();
    un.frozen.req.test();
  }
  for (Pending& p : pending_) p.req.test();
}

void Fsdp::start_gather(int u) {
  Unit& un = units_.at(static_cast<size_t>(u));
  if (un.state != State::Free) return;
  for (Group* g : {&un.train, &un.frozen}) {
    if (g->n == 0) continue;
    g->full = Tensor::empty({g->padded});
    track(static_cast<int64_t>(g->full.bytes()));
    g->req = comm_.iall_gather(g->shard.raw(), g->shard_len, g->full.raw(), Elem::F32);
  }
  un.state = State::InFlight;
  mem_.live_units_peak = std::max(mem_.live_units_peak, ++mem_.live_units);
}

void Fsdp::bind(int u, bool backward) {
  Unit& un = units_.at(static_cast<size_t>(u));
  if (un.state == State::InFlight) {
    un.train.req.wait();
    un.frozen.req.wait();
    un.state = State::Ready;
  }
  if (backward && un.train.n > 0) {
    un.grad_full = Tensor::zeros({un.train.padded});
    track(static_cast<int64_t>(un.grad_full.bytes()));
    mem_.live_grads_peak = std::max(mem_.live_grads_peak, ++mem_.live_grads);
  }
  for (Group* g : {&un.train, &un.frozen}) {
    int64_t off = 0;
    for (Param* p : g->params) {
      p->value = g->full.defined() && g->full.numel() > 0
                     ? Tensor(g->full.f32() + off, p->spec.shape, DType::F32)
                     : Tensor();
      p->grad = backward && g == &un.train
                    ? Tensor(un.grad_full.f32() + off, p->spec.shape, DType::F32)
                    : Tensor();
      off += numel_of(*p);
    }
  }
  model_.rebind_unit(u);
}

void Fsdp::release(int u, bool handed_off) {
  Unit& un = units_.at(static_cast<size_t>(u));
  for (Group* g : {&un.train, &un.frozen}) {
    g->req.wait();  // a prefetch never used must land before its buffer goes
    if (g->full.defined() && g->full.numel() > 0) track(-static_cast<int64_t>(g->full.bytes()));
    g->full = Tensor();
    for (Param* p : g->params) p->value = p->grad = Tensor();
  }
  if (un.grad_full.defined() && un.grad_full.numel() > 0) {
    track(-static_cast<int64_t>(un.grad_full.bytes()));
    if (!handed_off) --mem_.live_grads;  // bound but never reduced (a failed backward)
  }
  un.grad_full = Tensor();
  if (un.state != State::Free) --mem_.live_units;
  un.state = State::Free;
}

void Fsdp::complete_front() {
  Pending& p = pending_.front();
  p.req.wait();
  add_into(p.part, units_.at(static_cast<size_t>(p.unit)).grad_shard);
  track(-static_cast<int64_t>(p.full.bytes() + p.part.bytes()));
  --mem_.live_grads;
  pending_.pop_front();
}

void Fsdp::before_forward(int u) {
  poke();
  if (u == 0)  // a forward without backward (evaluation) leaves the head gathered
    for (size_t v = 0; v < units_.size(); ++v)
      if (units_[v].state == State::Ready) release(static_cast<int>(v));
  start_gather(u);
  if (u + 1 < model_.num_units()) start_gather(u + 1);
  bind(u, false);
}

void Fsdp::after_forward(int u) {
  // The head's backward follows at once: keep it rather than gather it again.
  if (u != model_.num_units() - 1) release(u);
}

void Fsdp::before_backward(int u) {
  poke();
  const bool values = model_.unit_backward_reads_values(u);
  if (values) start_gather(u);
  if (u > 0 && model_.unit_backward_reads_values(u - 1)) start_gather(u - 1);
  Unit& un = units_.at(static_cast<size_t>(u));
  if (!values && un.train.n == 0) return;  // nothing to compute into
  bind(u, true);
}

void Fsdp::after_backward(int u) {
  poke();
  Unit& un = units_.at(static_cast<size_t>(u));
  if (un.grad_full.defined() && un.train.n > 0) {
    Pending p;
    p.unit = u;
    p.full = un.grad_full;
    p.part = Tensor::empty({un.train.shard_len});
    track(static_cast<int64_t>(p.part.bytes() + p.full.bytes()));  // release() untracks full
    p.req = comm_.ireduce_scatter(p.full.raw(), p.part.raw(), un.train.shard_len, Elem::F32);
    pending_.push_back(std::move(p));
    release(u, true);
  } else {
    release(u);
  }
  // One reduction stays in flight across the next unit's backward.
  while (pending_.size() > 1 || (u == 0 && !pending_.empty())) complete_front();
}

void Fsdp::zero_grad() {
  for (Unit& un : units_) un.grad_shard.zero_();
}

void Fsdp::finish() {
  while (!pending_.empty()) complete_front();
  for (size_t u = 0; u < units_.size(); ++u) release(static_cast<int>(u));
}

void Fsdp::gather_to_store() {
  finish();
  for (size_t u = 0; u < units_.size(); ++u) {
    const int ui = static_cast<int>(u);
    start_gather(ui);
    bind(ui, false);
    Unit& un = units_[u];
    for (Group* g : {&un.train, &un.frozen})
      for (Param* p : g->params) p->value = p->value.clone();
    model_.rebind_unit(ui);
    for (Group* g : {&un.train, &un.frozen}) {
      if (g->full.defined() && g->full.numel() > 0) track(-static_cast<int64_t>(g->full.bytes()));
      g->full = Tensor();
    }
    un.state = State::Free;
    --mem_.live_units;
  }
}

void Fsdp::for_each_piece(
    const std::function<void(Param&, int64_t begin, float* data, int64_t count)>& fn) {
  const int64_t r = comm_.rank();
  for (Unit& un : units_)
    for (Group* g : {&un.train, &un.frozen}) {
      const int64_t a = r * g->shard_len, z = a + g->shard_len;
      int64_t off = 0;
      for (Param* p : g->params) {
        const int64_t n = numel_of(*p), lo = std::max(a, off), hi = std::min(z, off + n);
        if (lo < hi) fn(*p, lo - off, g->shard.f32() + (lo - a), hi - lo);
        off += n;
      }
    }
}

}  // namespace mt::par
