// DistTrainer, part: expert placement. Moved experts carry their weights, gradients and AdamW
// moments to their new EP rank in one all-to-all-v per layer (docs/load-balancing.md).
#include <cstring>
#include <map>

#include "model/moe_layer.h"
#include "parallel/dist_unit.h"

namespace mt::par {

int64_t DistTrainer::place_experts(const std::vector<std::vector<int32_t>>& expert_rank) {
  if (mesh_.ep <= 1) return 0;
  MT_CHECK(dev_ == Device::CPU, ConfigError,
           "balance.placement on a GPU mesh: moving experts between EP ranks runs on host "
           "memory only so far");
  MT_CHECK(!opt_.shard_expert_weights, ConfigError,
           "balance.placement with parallel.shard_expert_weights: moving sharded experts between "
           "EP ranks is not implemented");
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

}  // namespace mt::par
