#include "parallel/fsdp.h"

#include <algorithm>
#include <cstring>

namespace mt::par {

namespace {

void add_into(const Tensor& part, Tensor& acc) {
  const float* s = part.f32();
  float* d = acc.f32();
  for (int64_t i = 0; i < part.numel(); ++i) d[i] += s[i];
}

}  // namespace

Fsdp::Fsdp(Model& model, Comm& dense, Comm* experts, std::vector<FsdpUnitSpec> units)
    : model_(model), units_(units.size()) {
  MT_CHECK(static_cast<int>(units.size()) == model.num_units(), InternalError,
           "fsdp: ", units.size(), " unit specs for a model of ", model.num_units(), " units");
  for (size_t u = 0; u < units.size(); ++u) {
    Unit& un = units_[u];
    Part& dp = un.parts[0];
    Part& ep = un.parts[1];
    dp.comm = &dense;
    dp.train.params = std::move(units[u].train);
    dp.frozen.params = std::move(units[u].frozen);
    ep.comm = experts;
    ep.train.params = std::move(units[u].expert_train);
    ep.frozen.params = std::move(units[u].expert_frozen);
    MT_CHECK(experts || (ep.train.params.empty() && ep.frozen.params.empty()), InternalError,
             "fsdp: unit ", u, " shards experts without an expert-data-parallel group");
    std::vector<Tensor> fulls;  // the packed values, viewed by the layer until this unit is bound
    for (Part* pt : {&dp, &ep}) {
      if (!pt->comm) continue;
      const int64_t W = pt->comm->size(), r = pt->comm->rank();
      for (Group* g : {&pt->train, &pt->frozen}) {
        // Deferred weights (ModelOptions::defer_weights): a loader fills the shard afterwards,
        // so a group of nothing else needs neither the whole values nor their pages.
        bool deferred = true;
        for (const Param* p : g->params) {
          MT_CHECK(
              (p->value.defined() || is_placeholder(p->value)) && p->value.dtype() == DType::F32,
              InternalError, "fsdp: parameter ", p->name, " is not a defined fp32 tensor");
          deferred = deferred && is_placeholder(p->value);
          g->shapes.push_back(p->value.shape());
          shapes_[p] = p->value.shape();
          g->n += p->value.numel();
        }
        g->padded = (g->n + W - 1) / W * W;
        g->shard_len = g->padded / W;
        if (g->n == 0) continue;
        // Deferred: never written, so it stays virtual until freed (the layers only view it).
        Tensor full = deferred ? Tensor::empty({g->padded}) : Tensor::zeros({g->padded});
        int64_t off = 0;
        for (size_t k = 0; k < g->params.size(); ++k) {
          Param* p = g->params[k];
          if (!is_placeholder(p->value))
            std::memcpy(full.f32() + off, p->value.f32(), p->value.bytes());
          p->value = Tensor(full.f32() + off, g->shapes[k], DType::F32);
          p->grad = Tensor();
          off += g->shapes[k].numel();
        }
        g->shard = deferred ? Tensor::zeros({g->shard_len})
                            : full.rows(r * g->shard_len, (r + 1) * g->shard_len).clone();
        mem_.shard_bytes += static_cast<int64_t>(g->shard.bytes());
        if (pt == &ep) mem_.expert_shard_bytes += static_cast<int64_t>(g->shard.bytes());
        fulls.push_back(full);
      }
      pt->grad_shard = Tensor::zeros({std::max<int64_t>(pt->train.shard_len, 1)});
      if (pt->train.n > 0) mem_.grad_bytes += static_cast<int64_t>(pt->grad_shard.bytes());
    }
    // Rebinding drops the layer's owning references, so the full tensors die with `fulls`.
    model_.rebind_unit(static_cast<int>(u));
    for (Part* pt : {&dp, &ep})
      for (Group* g : {&pt->train, &pt->frozen})
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
  return shapes_.count(p) > 0;
}

const Shape& Fsdp::local_shape(const Param* p) const {
  const auto it = shapes_.find(p);
  MT_CHECK(it != shapes_.end(), InternalError, "fsdp: ", p->name, " is not sharded");
  return it->second;
}

void Fsdp::track(int64_t bytes) {
  mem_.transient_now += bytes;
  mem_.transient_peak = std::max(mem_.transient_peak, mem_.transient_now);
}

void Fsdp::poke() {
  for (Unit& un : units_)
    for (Part& pt : un.parts) {
      pt.train.req.test();
      pt.frozen.req.test();
    }
  for (Pending& p : pending_) p.req.test();
}

void Fsdp::start_gather(int u) {
  Unit& un = units_.at(static_cast<size_t>(u));
  if (un.state != State::Free) return;
  for (Part& pt : un.parts)
    for (Group* g : {&pt.train, &pt.frozen}) {
      if (g->n == 0) continue;
      g->full = Tensor::empty({g->padded});
      track(static_cast<int64_t>(g->full.bytes()));
      g->req = pt.comm->iall_gather(g->shard.raw(), g->shard_len, g->full.raw(), Elem::F32);
    }
  un.state = State::InFlight;
  mem_.live_units_peak = std::max(mem_.live_units_peak, ++mem_.live_units);
}

void Fsdp::bind(int u, bool backward) {
  Unit& un = units_.at(static_cast<size_t>(u));
  if (un.state == State::InFlight) {
    for (Part& pt : un.parts) {
      pt.train.req.wait();
      pt.frozen.req.wait();
    }
    un.state = State::Ready;
  }
  for (int k = 0; k < 2; ++k) {
    Part& pt = un.parts[k];
    if (backward && pt.train.n > 0) {
      pt.grad_full = Tensor::zeros({pt.train.padded});
      track(static_cast<int64_t>(pt.grad_full.bytes()));
      mem_.live_grads_peak = std::max(mem_.live_grads_peak, ++mem_.live_grads[k]);
    }
    for (Group* g : {&pt.train, &pt.frozen}) {
      int64_t off = 0;
      for (size_t j = 0; j < g->params.size(); ++j) {
        Param* p = g->params[j];
        p->value = g->full.defined() && g->full.numel() > 0
                       ? Tensor(g->full.f32() + off, g->shapes[j], DType::F32)
                       : Tensor();
        p->grad = backward && g == &pt.train
                      ? Tensor(pt.grad_full.f32() + off, g->shapes[j], DType::F32)
                      : Tensor();
        off += g->shapes[j].numel();
      }
    }
  }
  model_.rebind_unit(u);
}

void Fsdp::release(int u, bool handed_off) {
  Unit& un = units_.at(static_cast<size_t>(u));
  for (int k = 0; k < 2; ++k) {
    Part& pt = un.parts[k];
    for (Group* g : {&pt.train, &pt.frozen}) {
      g->req.wait();  // a prefetch never used must land before its buffer goes
      if (g->full.defined() && g->full.numel() > 0) track(-static_cast<int64_t>(g->full.bytes()));
      g->full = Tensor();
      for (Param* p : g->params) p->value = p->grad = Tensor();
    }
    if (pt.grad_full.defined() && pt.grad_full.numel() > 0) {
      track(-static_cast<int64_t>(pt.grad_full.bytes()));
      if (!handed_off) --mem_.live_grads[k];  // bound but never reduced (a failed backward)
    }
    pt.grad_full = Tensor();
  }
  if (un.state != State::Free) --mem_.live_units;
  un.state = State::Free;
}

void Fsdp::complete_front() {
  Pending& p = pending_.front();
  p.req.wait();
  add_into(p.piece, units_.at(static_cast<size_t>(p.unit)).parts[p.part].grad_shard);
  track(-static_cast<int64_t>(p.full.bytes() + p.piece.bytes()));
  --mem_.live_grads[p.part];
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
  const Unit& un = units_.at(static_cast<size_t>(u));
  if (!values && un.parts[0].train.n == 0 && un.parts[1].train.n == 0)
    return;  // nothing to compute into
  bind(u, true);
}

void Fsdp::after_backward(int u) {
  poke();
  Unit& un = units_.at(static_cast<size_t>(u));
  bool handed = false;
  for (int k = 0; k < 2; ++k) {
    Part& pt = un.parts[k];
    if (!pt.grad_full.defined() || pt.train.n == 0) continue;
    Pending p;
    p.unit = u;
    p.part = k;
    p.full = pt.grad_full;
    p.piece = Tensor::empty({pt.train.shard_len});
    track(static_cast<int64_t>(p.piece.bytes() + p.full.bytes()));  // release() untracks full
    p.req = pt.comm->ireduce_scatter(p.full.raw(), p.piece.raw(), pt.train.shard_len, Elem::F32);
    pending_.push_back(std::move(p));
    handed = true;
  }
  release(u, handed);
  // The latest unit's reductions stay in flight across the next unit's backward.
  while (!pending_.empty() && (u == 0 || pending_.front().unit != pending_.back().unit))
    complete_front();
}

void Fsdp::zero_grad() {
  for (Unit& un : units_)
    for (Part& pt : un.parts)
      if (pt.grad_shard.defined()) pt.grad_shard.zero_();
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
    for (Part& pt : un.parts)
      for (Group* g : {&pt.train, &pt.frozen})
        for (Param* p : g->params)
          if (p->value.defined()) p->value = p->value.clone();
    model_.rebind_unit(ui);
    for (Part& pt : un.parts)
      for (Group* g : {&pt.train, &pt.frozen}) {
        if (g->full.defined() && g->full.numel() > 0) track(-static_cast<int64_t>(g->full.bytes()));
        g->full = Tensor();
      }
    un.state = State::Free;
    --mem_.live_units;
  }
}

void Fsdp::for_each_piece(
    const std::function<void(Param&, int64_t begin, float* data, int64_t count)>& fn) {
  for (Unit& un : units_)
    for (Part& pt : un.parts) {
      if (!pt.comm) continue;
      const int64_t r = pt.comm->rank();
      for (Group* g : {&pt.train, &pt.frozen}) {
        const int64_t a = r * g->shard_len, z = a + g->shard_len;
        int64_t off = 0;
        for (size_t j = 0; j < g->params.size(); ++j) {
          const int64_t n = g->shapes[j].numel(), lo = std::max(a, off), hi = std::min(z, off + n);
          if (lo < hi) fn(*g->params[j], lo - off, g->shard.f32() + (lo - a), hi - lo);
          off += n;
        }
      }
    }
}

}  // namespace mt::par
