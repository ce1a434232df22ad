#include "parallel/dist_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "model/moe_layer.h"
#include "ops/optim.h"
#include "parallel/fsdp.h"

namespace mt::par {

struct DistTrainer::Unit {
  std::string name;
  std::vector<Param*> params;  // trainable only: frozen ones cost no gradient or state memory
  Comm* comm = nullptr;
  bool sharded = true;      // reduce-scatter + shard update + all-gather; else all-reduce
  bool counts_norm = true;  // replicated units add their norm on one replica only
  int64_t n = 0, padded = 0, shard = 0;
  Tensor m, v;           // optimizer moments: [shard] when sharded, else [n]
  Tensor gflat, gshard;  // live during one step only
  Request req;
  int model_unit = -1;  // the Model unit of a dense unit (0 embedding, 1 + i layer i, last head)
  int fsdp = -1;        // model unit whose Fsdp shards hold this unit's values and gradients
};

namespace {

std::string unit_name(int unit, int units) {
  if (unit == 0) return "embedding";
  if (unit == units - 1) return "head";
  return "layer " + std::to_string(unit - 1);
}

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

void add_stats(CommStats& into, const CommStats& s) {
  for (int c = 0; c < kNumCollectives; ++c) {
    CollectiveStats& a = into.per[c];
    const CollectiveStats& b = s.per[c];
    a.calls += b.calls;
    a.bytes_sent += b.bytes_sent;
    a.bytes_recv += b.bytes_recv;
    a.seconds += b.seconds;
    a.idle_seconds += b.idle_seconds;
  }
}

}  // namespace

double StepMetrics::comm_seconds() const {
  return world.total().seconds + ep.total().seconds + edp.total().seconds;
}

double StepMetrics::idle_seconds() const {
  return world.total().idle_seconds + ep.total().idle_seconds + edp.total().idle_seconds;
}

std::string StepMetrics::line(int rank) const {
  std::ostringstream os;
  os << "rank " << rank << ": comm " << comm_seconds() * 1e3 << " ms (idle " << idle_seconds() * 1e3
     << " ms), rows received " << rows_received;
  CommStats all;
  add_stats(all, world);
  add_stats(all, ep);
  add_stats(all, edp);
  for (int c = 0; c < kNumCollectives; ++c) {
    const CollectiveStats& s = all.per[c];
    if (s.calls == 0) continue;
    os << ", " << collective_name(static_cast<Collective>(c)) << " x" << s.calls << " sent "
       << s.bytes_sent << " B recv " << s.bytes_recv << " B";
  }
  return os.str();
}

DistTrainer::DistTrainer(Model& model, const Mesh& mesh, ProcessGroups& groups,
                         const DistOptions& opt)
    : model_(model), mesh_(mesh), g_(groups), opt_(opt) {
  MT_CHECK(groups.world && groups.world->size() == mesh.world, InternalError,
           "process groups do not match the mesh");
  std::vector<MoeLayer*> moes;
  for (MoeLayer* m : model.moe_layers())
    if (m) moes.push_back(m);
  if (!moes.empty()) {
    MT_CHECK(moes.front()->config().num_experts == mesh.num_experts, ConfigError, "mesh built for ",
             mesh.num_experts, " experts, the model has ", moes.front()->config().num_experts);
  }
  if (mesh.ep > 1) {
    std::vector<ExpertCompute*> computes;
    for (size_t i = 0; i < moes.size(); ++i) {
      ep_.push_back(std::make_unique<ExpertParallel>(*groups.ep, mesh.num_experts,
                                                     ExpertParallelOptions{opt.a2a_chunks}));
      computes.push_back(ep_.back().get());
    }
    model.shard_experts(mesh.first_expert(), mesh.local_experts, computes);
  }

  // The model's own unit of every parameter (its declared prefixes), so that nothing here reads
  // meaning into a parameter's name.
  const int U = model.num_units();
  for (int k = 0; k < U; ++k)
    for (const std::string& prefix : model.unit_prefixes(k))
      for (const auto& p : model.params().all())
        if (p->name.compare(0, prefix.size(), prefix) == 0) unit_of_[p.get()] = k;
  // Units in store order, so every rank builds the same flat layouts: the routed experts of all
  // layers form one unit (their replicas are the EDP group), each dense model unit another.
  std::map<int, Unit*> by_unit;  // key -1: the experts
  for (const auto& p : model.params().all()) {
    if (!p->trainable()) continue;
    const bool expert = p->spec.per_expert;
    const int key = expert ? -1 : model_unit(*p);
    Unit*& u = by_unit[key];
    if (!u) {
      units_.push_back(std::make_unique<Unit>());
      u = units_.back().get();
      u->name = expert ? "experts" : unit_name(key, U);
      u->model_unit = key;
      if (expert) {
        u->comm = groups.edp.get();
        u->sharded = mesh.shard_experts && mesh.replicas > 1;
        u->counts_norm = u->sharded || groups.edp->rank() == 0;
      } else {
        u->comm = groups.world;
      }
    }
    u->params.push_back(p.get());
    u->n += p->value.numel();
  }
  for (auto& u : units_) {
    const int64_t parts = u->sharded ? u->comm->size() : 1;
    u->padded = (u->n + parts - 1) / parts * parts;
    u->shard = u->padded / parts;
    u->m = Tensor::zeros({u->shard});
    u->v = Tensor::zeros({u->shard});
  }
  if (opt.fsdp) setup_fsdp();
}

void DistTrainer::setup_fsdp() {
  MT_CHECK(!model_.config().tie_embeddings, ConfigError,
           "fsdp: tied embeddings are not supported (the embedding and the head units would "
           "share one weight)");
  const int U = model_.num_units();
  std::vector<FsdpUnitSpec> specs(static_cast<size_t>(U));
  for (int k = 0; k < U; ++k)
    for (const std::string& prefix : model_.unit_prefixes(k))
      for (const auto& p : model_.params().all()) {
        if (p->name.compare(0, prefix.size(), prefix) != 0 || p->spec.per_expert ||
            p->spec.role == ParamRole::Buffer)
          continue;
        (p->trainable() ? specs[static_cast<size_t>(k)].train
                        : specs[static_cast<size_t>(k)].frozen)
            .push_back(p.get());
      }
  for (auto& u : units_) {
    if (u->comm != g_.world) continue;
    u->fsdp = u->model_unit;
    // The optimizer's moments must share the gradient shard's layout.
    MT_CHECK(specs[static_cast<size_t>(u->fsdp)].train == u->params, InternalError, "fsdp unit ",
             u->fsdp, " differs from optimizer unit ", u->name);
  }
  fsdp_ = std::make_unique<Fsdp>(model_, *g_.world, std::move(specs));
}

DistTrainer::~DistTrainer() = default;

void DistTrainer::gather_params() {
  if (fsdp_) fsdp_->gather_to_store();
}

MemoryReport DistTrainer::memory() const {
  MemoryReport r;
  r.optimizer = optimizer_bytes();
  for (const auto& p : model_.params().all()) {
    if (fsdp_ && fsdp_->owns(p.get())) continue;
    r.params += static_cast<int64_t>(p->value.bytes());
    if (p->trainable()) r.grads += static_cast<int64_t>(p->grad.bytes());
  }
  int64_t step = 0, largest = 0;
  for (const auto& u : units_) {
    if (u->fsdp >= 0) continue;
    // gflat (and gshard) of every unit are alive together; one pflat + shard copy at a time.
    step += u->padded * 4 + (u->sharded ? u->shard * 4 : 0);
    largest = std::max(largest, u->padded * 4 + (u->sharded ? u->shard * 4 : 0));
  }
  r.transient = step + largest;
  if (fsdp_) {
    r.params += fsdp_->memory().shard_bytes;
    r.grads += fsdp_->memory().grad_bytes;
    r.transient = std::max(r.transient, fsdp_->memory().transient_peak);
    r.fsdp_shards = fsdp_->memory().shard_bytes;
    r.fsdp_transient = fsdp_->memory().transient_peak;
    r.fsdp_units_peak = fsdp_->memory().live_units_peak;
    r.fsdp_grads_peak = fsdp_->memory().live_grads_peak;
  }
  return r;
}

int64_t DistTrainer::optimizer_bytes() const {
  int64_t b = 0;
  for (const auto& u : units_) b += static_cast<int64_t>(u->m.bytes() + u->v.bytes());
  return b;
}

DistTrainer::Shares DistTrainer::check_balanced(const SeqInfo& seq, const Tensor& targets) {
  int64_t valid = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) valid += targets.i32()[i] != -100;
  int64_t mine[3] = {seq.tokens, seq.num_seqs, valid};
  std::vector<int64_t> all(3 * static_cast<size_t>(mesh_.world));
  g_.world->all_gather(mine, 3, all.data(), Elem::I64);
  int64_t docs = 0, targets_all = 0;
  for (int r = 0; r < mesh_.world; ++r) {
    const size_t o = 3 * static_cast<size_t>(r);
    docs += all[o + 1];
    targets_all += all[o + 2];
    // Equal tokens make the per-token aux loss (router z) the mean of the rank means; targets
    // and documents differ freely and are weighted instead (forward_backward).
    MT_CHECK(all[o] == all[0], ValueError, "unbalanced batch: rank ", r, " has ", all[o],
             " tokens, rank 0 has ", all[0], " (every rank needs the same number of tokens)");
  }
  const double W = mesh_.world;
  Shares s;
  s.valid = valid;
  s.ce = targets_all > 0 ? static_cast<double>(valid) / static_cast<double>(targets_all) : 1 / W;
  s.docs = docs > 0 ? static_cast<double>(seq.num_seqs) / static_cast<double>(docs) : 1 / W;
  return s;
}

void DistTrainer::zero_grad() {
  g_.world->stats() = {};
  g_.ep->stats() = {};
  g_.edp->stats() = {};
  for (auto& e : ep_) e->reset_stats();
  model_.params().zero_grad();
  if (fsdp_) fsdp_->zero_grad();
}

double DistTrainer::forward_backward(Context& ctx, const SeqInfo& seq, const Tensor& ids,
                                     const Tensor& targets) {
  const Shares sh = check_balanced(seq, targets);
  const double loss = model_.forward(ctx, seq, ids, targets);
  // Weights are exactly 1 when the ranks hold equal shares, so the balanced case is untouched.
  model_.set_loss_weight(sh.valid > 0 ? static_cast<float>(sh.ce * mesh_.world) : 0.f,
                         static_cast<float>(sh.docs * mesh_.world));
  model_.backward(ctx);
  model_.set_loss_weight(1.f, 1.f);
  return g_.world->all_reduce_sum(sh.valid > 0 ? loss * sh.ce : 0.0);
}

StepResult DistTrainer::step(Context& ctx, const SeqInfo& seq, const Tensor& ids,
                             const Tensor& targets, float lr) {
  zero_grad();
  StepResult res;
  res.loss = forward_backward(ctx, seq, ids, targets);
  res.grad_norm = optimizer_step(ctx, lr);
  return res;
}

double DistTrainer::optimizer_step(Context& ctx, float lr, double grad_scale) {
  // Post every unit's gradient reduction, then complete them in order.
  const auto gs = static_cast<float>(grad_scale / mesh_.world);
  if (fsdp_) fsdp_->finish();
  for (auto& u : units_) {
    if (u->fsdp >= 0) {  // already reduce-scattered, unit by unit, during backward
      u->gshard = fsdp_->grad_shard(u->fsdp);
      continue;
    }
    u->gflat = Tensor::zeros({u->padded});
    pack(u->params, true, u->gflat.f32());
    if (u->sharded) {
      u->gshard = Tensor::empty({u->shard});
      u->req = u->comm->ireduce_scatter(u->gflat.raw(), u->gshard.raw(), u->shard, Elem::F32);
    } else {
      u->gshard = u->gflat;
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
      ops::adamw_step(ctx, hp, fsdp_->train_shard(u->fsdp), u->gshard, u->m, u->v);
      u->gshard = Tensor();
      continue;
    }
    Tensor pflat = Tensor::zeros({u->padded});
    pack(u->params, false, pflat.f32());
    if (u->sharded) {
      const int64_t b = u->comm->rank() * u->shard;
      Tensor mine = pflat.rows(b, b + u->shard).clone();
      ops::adamw_step(ctx, hp, mine, u->gshard, u->m, u->v);
      u->req = u->comm->iall_gather(mine.raw(), u->shard, pflat.raw(), Elem::F32);
      u->req.wait();
    } else {
      ops::adamw_step(ctx, hp, pflat, u->gshard, u->m, u->v);
    }
    unpack(pflat.f32(), u->params);
    u->gflat = Tensor();
    u->gshard = Tensor();
  }

  // Aux-loss-free balancing from the loads of all ranks' tokens.
  loads_.clear();
  for (MoeLayer* m : model_.moe_layers()) {
    loads_.emplace_back();
    if (!m) continue;
    std::vector<int64_t> load = m->expert_load();
    g_.world->all_reduce(load.data(), static_cast<int64_t>(load.size()), Elem::I64);
    m->update_selection_bias(load);
    m->reset_expert_load();
    loads_.back() = std::move(load);
  }

  metrics_ = {};
  metrics_.world = g_.world->stats();
  metrics_.ep = g_.ep->stats();
  metrics_.edp = g_.edp->stats();
  for (auto& e : ep_) metrics_.rows_received += e->rows_received();
  return norm;
}

bool DistTrainer::is_local_expert(const Param& p) const {
  return mesh_.ep > 1 && p.spec.per_expert;
}

int DistTrainer::model_unit(const Param& p) const {
  const auto it = unit_of_.find(&p);
  MT_CHECK(it != unit_of_.end(), InternalError, "parameter ", p.name, " is in no model unit");
  return it->second;
}

std::vector<int32_t> DistTrainer::expert_slots(int layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= slots_.size()) return {};
  return slots_[static_cast<size_t>(layer)];
}

template <typename F>
void DistTrainer::global_runs(const Param& p, int64_t lo, int64_t hi, F&& fn) const {
  if (lo >= hi) return;
  if (!is_local_expert(p)) {
    fn(lo, lo, hi - lo);
    return;
  }
  const int64_t El = mesh_.local_experts, row = p.value.numel() / p.value.shape()[0];
  const std::vector<int32_t> slots = expert_slots(model_unit(p) - 1);
  if (slots.empty()) {
    fn(mesh_.first_expert() * row + lo, lo, hi - lo);
    return;
  }
  std::vector<int64_t> logical(static_cast<size_t>(El), -1);
  for (size_t e = 0; e < slots.size(); ++e)
    if (slots[e] / El == mesh_.ep_rank)
      logical[static_cast<size_t>(slots[e] % El)] = static_cast<int64_t>(e);
  for (int64_t l = lo; l < hi;) {
    const int64_t j = l / row, end = std::min(hi, (j + 1) * row);
    fn(logical[static_cast<size_t>(j)] * row + (l - j * row), l, end - l);
    l = end;
  }
}

int64_t DistTrainer::place_experts(const std::vector<std::vector<int32_t>>& expert_rank) {
  if (mesh_.ep <= 1) return 0;
  const int64_t E = mesh_.num_experts, El = mesh_.local_experts;
  const int P = mesh_.ep, me = mesh_.ep_rank;
  std::vector<MoeLayer*> moes = model_.moe_layers();
  if (slots_.size() < moes.size()) slots_.resize(moes.size());

  // The expert unit's moments, whole on this rank while experts move (sharded over the EDP
  // replicas with shard_experts: every replica moves the same experts, so gather, move, re-cut).
  Unit* xu = nullptr;
  for (auto& u : units_)
    if (u->name == "experts") xu = u.get();
  Tensor m_all, v_all;
  std::map<const Param*, int64_t> moment_at;
  if (xu) {
    if (xu->sharded) {
      m_all = Tensor::empty({xu->padded});
      v_all = Tensor::empty({xu->padded});
      xu->comm->all_gather(xu->m.raw(), xu->shard, m_all.raw(), Elem::F32);
      xu->comm->all_gather(xu->v.raw(), xu->shard, v_all.raw(), Elem::F32);
    } else {
      m_all = xu->m;
      v_all = xu->v;
    }
    int64_t o = 0;
    for (const Param* p : xu->params) {
      moment_at[p] = o;
      o += p->value.numel();
    }
  }

  int64_t moved = 0;
  for (size_t i = 0; i < moes.size() && i < expert_rank.size(); ++i) {
    const std::vector<int32_t>& want = expert_rank[i];
    if (!moes[i] || want.empty()) continue;
    MT_CHECK(static_cast<int64_t>(want.size()) == E, ValueError, "place_experts: layer ", i,
             " has ", want.size(), " ranks for ", E, " experts");
    std::vector<int32_t> old = slots_[i], next(static_cast<size_t>(E));
    if (old.empty())
      for (int64_t e = 0; e < E; ++e) old.push_back(static_cast<int32_t>(e));
    std::vector<int64_t> fill(static_cast<size_t>(P), 0);
    for (int64_t e = 0; e < E; ++e) {
      const int32_t r = want[static_cast<size_t>(e)];
      MT_CHECK(r >= 0 && r < P && fill[static_cast<size_t>(r)] < El, ValueError,
               "place_experts: layer ", i, " expert ", e, " -> rank ", r, " (", P, " EP ranks of ",
               El, " experts each)");
      next[static_cast<size_t>(e)] = static_cast<int32_t>(r * El + fill[static_cast<size_t>(r)]++);
      moved += r != old[static_cast<size_t>(e)] / El;
    }
    if (next == old) continue;

    // One expert's state, in a fixed order both ends know: per parameter its value row, then
    // its gradient row and moment rows when it has them.
    struct Part {
      Param* p;
      int64_t row, moment;  // moment: offset in the unit's flat moments, -1 without
    };
    std::vector<Part> parts;
    int64_t per_expert = 0;
    for (const auto& p : model_.params().all()) {
      if (!p->spec.per_expert || model_unit(*p) != static_cast<int>(i) + 1) continue;
      const auto it = moment_at.find(p.get());
      Part part{p.get(), p->value.numel() / El, it == moment_at.end() ? -1 : it->second};
      per_expert += part.row * (1 + (p->grad.defined() ? 1 : 0) + (part.moment >= 0 ? 2 : 0));
      parts.push_back(part);
    }
    auto each_field = [&](int64_t slot, auto&& f) {
      for (const Part& q : parts) {
        const int64_t at = slot * q.row;
        f(q.p->value.f32() + at, q.row);
        if (q.p->grad.defined()) f(q.p->grad.f32() + at, q.row);
        if (q.moment >= 0) {
          f(m_all.f32() + q.moment + at, q.row);
          f(v_all.f32() + q.moment + at, q.row);
        }
      }
    };
    const auto owner = [&](const std::vector<int32_t>& sl, int64_t e) {
      return static_cast<int>(sl[static_cast<size_t>(e)] / El);
    };
    const size_t Pn = static_cast<size_t>(P);
    std::vector<int64_t> sc(Pn, 0), sd(Pn, 0), rc(Pn, 0), rd(Pn, 0);
    for (int64_t e = 0; e < E; ++e) {
      if (owner(old, e) == me) sc[static_cast<size_t>(owner(next, e))] += per_expert;
      if (owner(next, e) == me) rc[static_cast<size_t>(owner(old, e))] += per_expert;
    }
    for (size_t q = 1; q < Pn; ++q) {
      sd[q] = sd[q - 1] + sc[q - 1];
      rd[q] = rd[q - 1] + rc[q - 1];
    }
    // Peers are walked in ascending logical order on both ends, so no ids travel.
    Tensor send = Tensor::empty({El * per_expert}), recv = Tensor::empty({El * per_expert});
    std::vector<int64_t> pos = sd;
    for (int64_t e = 0; e < E; ++e) {
      if (owner(old, e) != me) continue;
      int64_t& w = pos[static_cast<size_t>(owner(next, e))];
      each_field(old[static_cast<size_t>(e)] - me * El, [&](const float* src, int64_t n) {
        std::memcpy(send.f32() + w, src, static_cast<size_t>(n) * sizeof(float));
        w += n;
      });
    }
    g_.ep->iall_to_all_v(send.raw(), sc, sd, recv.raw(), rc, rd, Elem::F32).wait();
    pos = rd;
    for (int64_t e = 0; e < E; ++e) {
      if (owner(next, e) != me) continue;
      int64_t& r = pos[static_cast<size_t>(owner(old, e))];
      each_field(next[static_cast<size_t>(e)] - me * El, [&](float* dst, int64_t n) {
        std::memcpy(dst, recv.f32() + r, static_cast<size_t>(n) * sizeof(float));
        r += n;
      });
    }
    moes[i]->set_expert_slots(next);
    slots_[i] = std::move(next);
  }
  if (xu && xu->sharded) {
    const int64_t b = xu->comm->rank() * xu->shard;
    std::memcpy(xu->m.f32(), m_all.f32() + b, static_cast<size_t>(xu->shard) * sizeof(float));
    std::memcpy(xu->v.f32(), v_all.f32() + b, static_cast<size_t>(xu->shard) * sizeof(float));
  }
  return moved;
}

namespace {

// Even split of n elements over `parts`: the range of part i.
std::pair<int64_t, int64_t> even_range(int64_t n, int parts, int i) {
  const int64_t c = (n + parts - 1) / parts;
  return {std::min(n, c * i), std::min(n, c * (i + 1))};
}

}  // namespace

std::vector<ShardPiece> DistTrainer::checkpoint_pieces() const {
  std::vector<ShardPiece> out;
  auto add = [&](const std::string& name, const Shape& full, int64_t begin, const float* src,
                 int64_t count) {
    if (count <= 0) return;
    ShardPiece sp{.name = name, .full_shape = full, .begin = begin, .end = begin + count};
    sp.data = Tensor::empty({count});
    std::memcpy(sp.data.f32(), src, static_cast<size_t>(count) * sizeof(float));
    out.push_back(std::move(sp));
  };
  const auto sharded = [&](const Param& p) { return fsdp_ && fsdp_->owns(&p); };
  auto full_shape = [&](const Param& p) {
    if (sharded(p)) return p.spec.shape;
    std::vector<int64_t> d = p.value.shape().dims();
    if (is_local_expert(p)) d[0] = mesh_.num_experts;
    return Shape(d);
  };
  for (const auto& p : model_.params().all()) {
    if (sharded(*p)) continue;  // written from the Fsdp shards below
    Comm& group = p->spec.per_expert ? *g_.edp : *g_.world;
    const auto [b, e] = even_range(p->value.numel(), group.size(), group.rank());
    global_runs(*p, b, e, [&](int64_t g, int64_t l, int64_t n) {
      add(p->name, full_shape(*p), g, p->value.f32() + l, n);
    });
  }
  if (fsdp_)
    fsdp_->for_each_piece([&](Param& p, int64_t begin, float* data, int64_t count) {
      add(p.name, p.spec.shape, begin, data, count);
    });
  for (const auto& u : units_) {
    if (!u->counts_norm) continue;  // a replica of the same state another rank writes
    const int64_t a = u->sharded ? u->comm->rank() * u->shard : 0;
    const int64_t z = std::min(u->n, a + u->shard);
    int64_t o = 0;
    for (const Param* p : u->params) {
      const int64_t n = sharded(*p) ? p->spec.shape.numel() : p->value.numel(), lo = std::max(a, o),
                    hi = std::min(z, o + n);
      global_runs(*p, lo - o, hi - o, [&](int64_t g, int64_t l, int64_t c) {
        add("m." + p->name, full_shape(*p), g, u->m.f32() + (o + l - a), c);
        add("v." + p->name, full_shape(*p), g, u->v.f32() + (o + l - a), c);
      });
      o += n;
    }
  }
  return out;
}

void DistTrainer::load_pieces(const PieceReader& read, int64_t optimizer_steps) {
  const auto sharded = [&](const Param& p) { return fsdp_ && fsdp_->owns(&p); };
  if (fsdp_) {
    fsdp_->finish();
    fsdp_->for_each_piece([&](Param& p, int64_t begin, float* data, int64_t count) {
      read(p.name, begin, begin + count, data);
    });
  }
  for (const auto& p : model_.params().all()) {
    if (sharded(*p)) continue;
    global_runs(*p, 0, p->value.numel(), [&](int64_t g, int64_t l, int64_t n) {
      read(p->name, g, g + n, p->value.f32() + l);
    });
  }
  for (auto& u : units_) {
    const int64_t a = u->sharded ? u->comm->rank() * u->shard : 0;
    const int64_t z = std::min(u->n, a + u->shard);
    int64_t o = 0;
    for (const Param* p : u->params) {
      const int64_t n = sharded(*p) ? p->spec.shape.numel() : p->value.numel(), lo = std::max(a, o),
                    hi = std::min(z, o + n);
      global_runs(*p, lo - o, hi - o, [&](int64_t g, int64_t l, int64_t c) {
        read("m." + p->name, g, g + c, u->m.f32() + (o + l - a));
        read("v." + p->name, g, g + c, u->v.f32() + (o + l - a));
      });
      o += n;
    }
  }
  step_ = optimizer_steps;
}

}  // namespace mt::par
