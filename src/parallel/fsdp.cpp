#include "parallel/fsdp.h"

#include <algorithm>

#include "ops/elementwise.h"

namespace mt::par {

namespace {

// Elements [begin, begin + n) of a buffer, in the shape of the parameter they hold.
Tensor flat_view(const Tensor& buffer, int64_t begin, const Shape& shape) {
  return buffer.rows(begin, begin + shape.numel()).view(shape);
}

}  // namespace

Fsdp::Fsdp(Model& model, Comm& dense, Comm* experts, std::vector<FsdpUnitSpec> units, Device device)
    : model_(model), device_(device), units_(units.size()) {
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
    for (Part* pt : {&dp, &ep}) {
      if (!pt->comm) continue;
      const int64_t W = pt->comm->size();
      for (Group* g : {&pt->train, &pt->frozen}) {
        for (const Param* p : g->params) {
          MT_CHECK(
              (p->value.defined() || is_placeholder(p->value)) && p->value.dtype() == DType::F32,
              InternalError, "fsdp: parameter ", p->name, " is not a defined fp32 tensor");
          g->shapes.push_back(p->value.shape());
          shapes_[p] = p->value.shape();
          g->n += p->value.numel();
        }
        g->padded = (g->n + W - 1) / W * W;
        g->shard_len = g->padded / W;
        if (g->n == 0) continue;
        // Zero padding; deferred weights (ModelOptions::defer_weights) stay zero until a loader
        // fills the shard.
        g->shard = Tensor::zeros({g->shard_len}, DType::F32, device_);
        mem_.shard_bytes += static_cast<int64_t>(g->shard.bytes());
        if (pt == &ep) mem_.expert_shard_bytes += static_cast<int64_t>(g->shard.bytes());
      }
      pt->frozen.offset = pt->train.padded;
      pt->grad_shard =
          Tensor::zeros({std::max<int64_t>(pt->train.shard_len, 1)}, DType::F32, device_);
      if (pt->train.n > 0) mem_.grad_bytes += static_cast<int64_t>(pt->grad_shard.bytes());
    }
  }
  // Rank r of a part's communicator keeps elements [r * shard, (r + 1) * shard) of each flat
  // buffer: the same pieces a checkpoint loader writes.
  for_each_piece([](Param& p, int64_t begin, Tensor piece) {
    if (!is_placeholder(p.value))
      piece.copy_from(p.value.view({p.value.numel()}).rows(begin, begin + piece.numel()));
  });
  plan_buffers();
  for (size_t u = 0; u < units_.size(); ++u) {
    // Rebinding drops the layer's references to the whole tensors, which die here.
    bind_layers(static_cast<int>(u));
    for (Part& pt : units_[u].parts)
      for (Group* g : {&pt.train, &pt.frozen})
        for (Param* p : g->params) p->value = p->grad = Tensor();
  }
  pending_.reserve(4);
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

void Fsdp::plan_buffers() {
  // Both parities sized for the largest unit, as the planner counts them (plan/model_stats.cpp).
  int64_t values[2] = {}, grads[2] = {}, pieces[2] = {};
  for (const Unit& un : units_)
    for (int k = 0; k < 2; ++k) {
      const Part& pt = un.parts[k];
      values[k] = std::max(values[k], pt.train.padded + pt.frozen.padded);
      grads[k] = std::max(grads[k], pt.train.padded);
      pieces[k] = std::max(pieces[k], pt.train.shard_len);
    }
  for (int k = 0; k < 2; ++k)
    for (Buffers& b : buffers_[k]) {
      if (values[k] > 0) {
        b.values_mem = Arena(arena_footprint(static_cast<size_t>(values[k]) * sizeof(float)),
                             device_, "fsdp unit values");
        b.values = b.values_mem.alloc({values[k]});
      }
      if (grads[k] > 0) {
        b.grad_mem = Arena(arena_footprint(static_cast<size_t>(grads[k]) * sizeof(float)) +
                               arena_footprint(static_cast<size_t>(pieces[k]) * sizeof(float)),
                           device_, "fsdp unit gradient");
        b.grad = b.grad_mem.alloc({grads[k]});
        b.piece = b.grad_mem.alloc({pieces[k]});
      }
      mem_.buffer_bytes += static_cast<int64_t>(b.values_mem.capacity() + b.grad_mem.capacity());
    }
}

void Fsdp::bind_layers(int u) {
  Unit& un = units_.at(static_cast<size_t>(u));
  for (int k = 0; k < 2; ++k) {
    Part& pt = un.parts[k];
    const Buffers& b = buffers(u, k);
    for (Group* g : {&pt.train, &pt.frozen}) {
      int64_t off = 0;
      for (size_t j = 0; j < g->params.size(); ++j) {
        Param* p = g->params[j];
        p->value = flat_view(b.values, g->offset + off, g->shapes[j]);
        p->grad = g == &pt.train ? flat_view(b.grad, off, g->shapes[j]) : Tensor();
        off += g->shapes[j].numel();
      }
    }
  }
  model_.rebind_unit(u);
  un.binds = model_.unit_binds(u);
}

bool Fsdp::owns(const Param* p) const {
  return shapes_.count(p) > 0;
}

const Shape& Fsdp::local_shape(const Param* p) const {
  const auto it = shapes_.find(p);
  MT_CHECK(it != shapes_.end(), InternalError, "fsdp: ", p->name, " is not sharded");
  return it->second;
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
  for (int k = 0; k < 2; ++k) {
    Part& pt = un.parts[k];
    if (pt.train.n + pt.frozen.n == 0) continue;
    Buffers& b = buffers(u, k);
    MT_CHECK(b.value_owner < 0, InternalError, "fsdp: gathering unit ", u,
             " would overwrite the values of unit ", b.value_owner, " (buffer ", u % 2, ")");
    b.value_owner = u;
    for (Group* g : {&pt.train, &pt.frozen})
      if (g->n > 0)
        g->req =
            pt.comm->iall_gather(g->shard.raw(), g->shard_len,
                                 b.values.rows(g->offset, g->offset + g->padded).raw(), Elem::F32);
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
  if (un.binds != model_.unit_binds(u)) bind_layers(u);
  for (int k = 0; k < 2; ++k) {
    Part& pt = un.parts[k];
    Buffers& b = buffers(u, k);
    const bool grads = backward && pt.train.n > 0;
    if (grads) {
      // A later unit's reduction may still hold this parity's buffer when the units between
      // have nothing to train (an odd run of frozen units): it lands first.
      while (b.grad_owner >= 0 && !pending_.empty()) complete_front();
      MT_CHECK(b.grad_owner < 0, InternalError, "fsdp: unit ", u,
               " needs the gradient buffer still holding unit ", b.grad_owner);
      b.grad_owner = u;
      pt.grad_bound = true;
      b.grad.rows(0, pt.train.padded).zero_();
      mem_.live_grads_peak = std::max(mem_.live_grads_peak, ++mem_.live_grads[k]);
    }
    for (Group* g : {&pt.train, &pt.frozen}) {
      int64_t off = 0;
      for (size_t j = 0; j < g->params.size(); ++j) {
        Param* p = g->params[j];
        p->value = un.state == State::Ready ? flat_view(b.values, g->offset + off, g->shapes[j])
                                            : Tensor();
        p->grad = grads && g == &pt.train ? flat_view(b.grad, off, g->shapes[j]) : Tensor();
        off += g->shapes[j].numel();
      }
    }
  }
}

void Fsdp::free_buffers(int u) {
  Unit& un = units_.at(static_cast<size_t>(u));
  for (int k = 0; k < 2; ++k) {
    Part& pt = un.parts[k];
    Buffers& b = buffers(u, k);
    pt.train.req.wait();  // a prefetch never used must land before its buffer is reused
    pt.frozen.req.wait();
    if (b.value_owner == u) {
      b.value_owner = -1;
      b.values_mem.discard();
    }
    if (pt.grad_bound) {  // bound but never reduced (a failed backward)
      b.grad_owner = -1;
      b.grad_mem.discard();
      pt.grad_bound = false;
      --mem_.live_grads[k];
    }
  }
  if (un.state != State::Free) --mem_.live_units;
  un.state = State::Free;
}

void Fsdp::release(int u) {
  free_buffers(u);
  for (Part& pt : units_.at(static_cast<size_t>(u)).parts)
    for (Group* g : {&pt.train, &pt.frozen})
      for (Param* p : g->params) p->value = p->grad = Tensor();
}

void Fsdp::complete_front() {
  Pending& p = pending_.front();
  p.req.wait();
  Buffers& b = buffers(p.unit, p.part);
  Part& pt = units_.at(static_cast<size_t>(p.unit)).parts[p.part];
  MT_CHECK(ctx_, InternalError, "fsdp: a gradient reduction completes without a context");
  Tensor acc = pt.grad_shard.rows(0, pt.train.shard_len);
  ops::add_into(*ctx_, b.piece.rows(0, pt.train.shard_len), acc);
  b.grad_owner = -1;
  b.grad_mem.discard();
  --mem_.live_grads[p.part];
  pending_.erase(pending_.begin());
}

void Fsdp::before_forward(int u) {
  poke();
  if (u == 0)  // a forward without backward (evaluation) leaves the head gathered
    for (size_t v = 0; v < units_.size(); ++v)
      if (units_[v].state != State::Free) release(static_cast<int>(v));
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
  for (int k = 0; k < 2; ++k) {
    Part& pt = un.parts[k];
    if (!pt.grad_bound) continue;
    const Buffers& b = buffers(u, k);
    pending_.push_back({.unit = u,
                        .part = k,
                        .req = pt.comm->ireduce_scatter(b.grad.raw(), b.piece.raw(),
                                                        pt.train.shard_len, Elem::F32)});
    pt.grad_bound = false;  // the pending reduction owns the buffer now
  }
  release(u);
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
    // The layers now hold the whole copies; the next bind() returns them to the buffers.
    model_.rebind_unit(ui);
    free_buffers(ui);
  }
}

void Fsdp::for_each_piece(const std::function<void(Param&, int64_t begin, Tensor piece)>& fn) {
  for (Unit& un : units_)
    for (Part& pt : un.parts) {
      if (!pt.comm) continue;
      const int64_t r = pt.comm->rank();
      for (Group* g : {&pt.train, &pt.frozen}) {
        const int64_t a = r * g->shard_len, z = a + g->shard_len;
        int64_t off = 0;
        for (size_t j = 0; j < g->params.size(); ++j) {
          const int64_t n = g->shapes[j].numel(), lo = std::max(a, off), hi = std::min(z, off + n);
          if (lo < hi) fn(*g->params[j], lo - off, g->shard.rows(lo - a, hi - a));
          off += n;
        }
      }
    }
}

}  // namespace mt::par
