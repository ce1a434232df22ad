// DistTrainer, part: sharded checkpoint pieces in single-process coordinates, and loading them
// into any mesh.
#include <algorithm>

#include "parallel/dist_unit.h"
#include "parallel/fsdp.h"

namespace mt::par {

template <typename F>
void DistTrainer::global_runs(const Param& p, int64_t lo, int64_t hi, F&& fn) const {
  if (lo >= hi) return;
  if (!is_local_expert(p)) {
    fn(lo, lo, hi - lo);
    return;
  }
  const Shape shape = local_shape(p);
  const int64_t El = mesh_.local_experts, row = shape.numel() / shape[0];
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
template <typename F>
void DistTrainer::moment_runs(F&& fn) const {
  for (const auto& u : units_) {
    const int64_t a = u->sharded ? u->comm->rank() * u->shard : 0;
    const int64_t z = std::min(u->n, a + u->shard);
    int64_t o = 0;
    for (const Param* p : u->params) {
      const int64_t n = local_shape(*p).numel(), lo = std::max(a, o), hi = std::min(z, o + n);
      global_runs(*p, lo - o, hi - o,
                  [&](int64_t g, int64_t l, int64_t c) { fn(*u, *p, g, o + l - a, c); });
      o += n;
    }
  }
}

namespace {

// Even split of n elements over `parts`: the range of part i.
std::pair<int64_t, int64_t> even_range(int64_t n, int parts, int i) {
  const int64_t c = (n + parts - 1) / parts;
  return {std::min(n, c * i), std::min(n, c * (i + 1))};
}

// Elements [begin, begin + count) of a tensor, flattened: a view on the tensor's device.
Tensor flat_range(const Tensor& t, int64_t begin, int64_t count) {
  return t.view({t.numel()}).rows(begin, begin + count);
}

// Reads a piece into `dst` (a 1-D view): directly on the host, through a host copy on a GPU
// (checkpoints are not part of a step, so the copy's wait is free to take).
void read_into(const PieceReader& read, const std::string& name, int64_t begin, Tensor dst) {
  if (dst.device() == Device::CPU) {
    read(name, begin, begin + dst.numel(), dst.f32());
    return;
  }
  Tensor host = Tensor::empty({dst.numel()});
  read(name, begin, begin + dst.numel(), host.f32());
  dst.copy_from(host);
}

}  // namespace

std::vector<ShardPiece> DistTrainer::checkpoint_pieces() const {
  std::vector<ShardPiece> out;
  // Pieces are host tensors: a GPU's are copied back (one copy each, outside the step).
  auto add = [&](const std::string& name, const Shape& full, int64_t begin, const Tensor& src) {
    const int64_t count = src.numel();
    if (count <= 0) return;
    ShardPiece sp{.name = name, .full_shape = full, .begin = begin, .end = begin + count};
    sp.data = Tensor::empty({count});
    sp.data.copy_from(src);
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
      add(p->name, full_shape(*p), g, flat_range(p->value, l, n));
    });
  }
  if (fsdp_)
    fsdp_->for_each_piece([&](Param& p, int64_t begin, Tensor piece) {
      global_runs(p, begin, begin + piece.numel(), [&](int64_t g, int64_t l, int64_t n) {
        add(p.name, p.spec.shape, g, piece.rows(l - begin, l - begin + n));
      });
    });
  moment_runs([&](const Unit& u, const Param& p, int64_t g, int64_t at, int64_t c) {
    if (!u.counts_norm) return;  // a replica of the same state another rank writes
    add("m." + p.name, full_shape(p), g, u.m.rows(at, at + c));
    add("v." + p.name, full_shape(p), g, u.v.rows(at, at + c));
  });
  return out;
}

void DistTrainer::load_pieces(const PieceReader& read, int64_t optimizer_steps) {
  load_weights(read);
  moment_runs([&](const Unit& u, const Param& p, int64_t g, int64_t at, int64_t c) {
    read_into(read, "m." + p.name, g, u.m.rows(at, at + c));
    read_into(read, "v." + p.name, g, u.v.rows(at, at + c));
  });
  step_ = optimizer_steps;
}

void DistTrainer::load_weights(const PieceReader& read, const LoadProgress& progress) {
  // The rank's reads are listed first, so that progress knows their total before the first.
  struct Read {
    const std::string* name;
    int64_t begin, end;
    Tensor out;  // 1-D view of the destination
  };
  std::vector<Read> reads;
  const auto sharded = [&](const Param& p) { return fsdp_ && fsdp_->owns(&p); };
  if (fsdp_) {
    fsdp_->finish();
    fsdp_->for_each_piece([&](Param& p, int64_t begin, Tensor piece) {
      global_runs(p, begin, begin + piece.numel(), [&](int64_t g, int64_t l, int64_t n) {
        reads.push_back({&p.name, g, g + n, piece.rows(l - begin, l - begin + n)});
      });
    });
  }
  for (const auto& p : model_.params().all()) {
    if (sharded(*p)) continue;
    global_runs(*p, 0, p->value.numel(), [&](int64_t g, int64_t l, int64_t n) {
      reads.push_back({&p->name, g, g + n, flat_range(p->value, l, n)});
    });
  }
  uint64_t total = 0, done = 0;
  for (const Read& r : reads) total += static_cast<uint64_t>(r.end - r.begin) * sizeof(float);
  for (const Read& r : reads) {
    read_into(read, *r.name, r.begin, r.out);
    done += static_cast<uint64_t>(r.end - r.begin) * sizeof(float);
    if (progress) progress(done, total);
  }
  if (progress && reads.empty()) progress(0, 0);
}

}  // namespace mt::par
