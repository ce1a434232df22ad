#include "parallel/dist_trainer.h"

#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "model/moe_layer.h"
#include "ops/optim.h"

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
};

namespace {

bool is_expert_param(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

std::string unit_of(const std::string& name) {
  const std::string layers = "model.layers.";
  if (name.compare(0, layers.size(), layers) == 0)
    return "layer " + name.substr(layers.size(), name.find('.', layers.size()) - layers.size());
  if (name.find("embed_tokens") != std::string::npos) return "embedding";
  return "head";
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

  // Units in store order, so every rank builds the same flat layouts.
  std::map<std::string, Unit*> by_name;
  for (const auto& p : model.params().all()) {
    if (!p->trainable()) continue;
    const bool expert = is_expert_param(p->name);
    const std::string key = expert ? "experts" : unit_of(p->name);
    Unit*& u = by_name[key];
    if (!u) {
      units_.push_back(std::make_unique<Unit>());
      u = units_.back().get();
      u->name = key;
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
}

DistTrainer::~DistTrainer() = default;

int64_t DistTrainer::optimizer_bytes() const {
  int64_t b = 0;
  for (const auto& u : units_) b += static_cast<int64_t>(u->m.bytes() + u->v.bytes());
  return b;
}

void DistTrainer::check_balanced(const SeqInfo& seq, const Tensor& targets) {
  int64_t valid = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) valid += targets.i32()[i] != -100;
  int64_t mine[3] = {seq.tokens, seq.num_seqs, valid};
  std::vector<int64_t> all(3 * static_cast<size_t>(mesh_.world));
  g_.world->all_gather(mine, 3, all.data(), Elem::I64);
  for (int r = 1; r < mesh_.world; ++r)
    for (int k = 0; k < 3; ++k)
      MT_CHECK(
          all[3 * static_cast<size_t>(r) + static_cast<size_t>(k)] == all[static_cast<size_t>(k)],
          ValueError, "unbalanced batch: rank ", r, " has ", all[3 * static_cast<size_t>(r)],
          " tokens / ", all[3 * static_cast<size_t>(r) + 1], " documents / ",
          all[3 * static_cast<size_t>(r) + 2], " targets, rank 0 has ", all[0], " / ", all[1],
          " / ", all[2]);
}

StepResult DistTrainer::step(Context& ctx, const SeqInfo& seq, const Tensor& ids,
                             const Tensor& targets, float lr) {
  g_.world->stats() = {};
  g_.ep->stats() = {};
  g_.edp->stats() = {};
  for (auto& e : ep_) e->reset_stats();
  check_balanced(seq, targets);

  ParamStore& store = model_.params();
  store.zero_grad();
  StepResult res;
  res.loss = model_.forward(ctx, seq, ids, targets);
  model_.backward(ctx);

  // Post every unit's gradient reduction, then complete them in order.
  const float inv_world = 1.0f / static_cast<float>(mesh_.world);
  for (auto& u : units_) {
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
    scale(u->gshard, inv_world);
    if (u->counts_norm) sq += sum_sq(u->gshard);
  }
  res.grad_norm = std::sqrt(g_.world->all_reduce_sum(sq));
  const double clip = opt_.adam.clip_norm;
  if (clip > 0 && res.grad_norm > clip) {
    // The same coefficient ops::clip_grad_norm applies on one process.
    const float c = static_cast<float>(clip / (res.grad_norm + 1e-6));
    for (auto& u : units_) scale(u->gshard, c);
  }

  ++step_;
  const ops::AdamWParams hp{.lr = lr,
                            .beta1 = opt_.adam.beta1,
                            .beta2 = opt_.adam.beta2,
                            .eps = opt_.adam.eps,
                            .weight_decay = opt_.adam.weight_decay,
                            .step = step_};
  for (auto& u : units_) {
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
  for (MoeLayer* m : model_.moe_layers()) {
    if (!m) continue;
    std::vector<int64_t> load = m->expert_load();
    g_.world->all_reduce(load.data(), static_cast<int64_t>(load.size()), Elem::I64);
    m->update_selection_bias(load);
    m->reset_expert_load();
  }
  res.loss = g_.world->all_reduce_sum(res.loss) / mesh_.world;

  metrics_ = {};
  metrics_.world = g_.world->stats();
  metrics_.ep = g_.ep->stats();
  metrics_.edp = g_.edp->stats();
  for (auto& e : ep_) metrics_.rows_received += e->rows_received();
  return res;
}

}  // namespace mt::par
