#include "parallel/expert_parallel.h"

#include <algorithm>
#include <cstring>

namespace mt::par {

namespace {

int64_t piece_begin(int64_t n, int c, int chunks) {
  return n * c / chunks;
}

}  // namespace

ExpertParallel::ExpertParallel(Comm& ep, int64_t num_experts, const ExpertParallelOptions& opt)
    : ep_(ep), P_(ep.size()), E_(num_experts), chunks_(opt.chunks) {
  MT_CHECK(num_experts > 0 && num_experts % P_ == 0, ConfigError, "expert-parallel size ", P_,
           " does not divide the ", num_experts, " routed experts");
  MT_CHECK(opt.chunks >= 1, ConfigError, "all-to-all chunks must be >= 1, got ", opt.chunks);
  El_ = E_ / P_;
}

void ExpertParallel::set_chunks(int chunks) {
  MT_CHECK(chunks >= 1, ConfigError, "all-to-all chunks must be >= 1, got ", chunks);
  chunks_ = chunks;
}

ops::GroupedFfnParams ExpertParallel::local_params(const ops::GroupedFfnParams& p,
                                                   int64_t rows) const {
  ops::GroupedFfnParams q = p;
  q.rows = rows;
  q.experts = El_;
  return q;
}

template <typename F>
void ExpertParallel::exchange(const Tensor& src, Tensor& recv, Tensor& back, Tensor& dst,
                              F&& each) {
  // The plan's own count: a set_chunks between forward and backward must not change backward.
  const int n = static_cast<int>(chunk_.size());
  std::vector<Request> out(static_cast<size_t>(n)), ret(static_cast<size_t>(n));
  for (int c = 0; c < n; ++c) {
    Chunk& k = chunk_[static_cast<size_t>(c)];
    out[static_cast<size_t>(c)] =
        ep_.iall_to_all_v(src.raw(), k.send_counts, k.send_displs, recv.raw(), k.recv_counts,
                          k.recv_displs, Elem::F32);
  }
  for (int c = 0; c < n; ++c) {
    Chunk& k = chunk_[static_cast<size_t>(c)];
    out[static_cast<size_t>(c)].wait();
    each(k);
    // The way back mirrors the way out: our receive layout becomes the send layout.
    ret[static_cast<size_t>(c)] =
        ep_.iall_to_all_v(back.raw(), k.recv_counts, k.recv_displs, dst.raw(), k.send_counts,
                          k.send_displs, Elem::F32);
  }
  for (Request& r : ret) r.wait();
}

void ExpertParallel::forward(Context& ctx, const ops::GroupedFfnParams& p, const Tensor& rows,
                             const Tensor& offsets, const ops::GroupedFfnWeights& local,
                             Tensor& out) {
  const int64_t N = p.rows, l = p.in;
  expect_shape(rows, {N, l}, "expert-parallel rows");
  expect_shape(out, {N, l}, "expert-parallel output");
  expect_shape(offsets, {E_ + 1}, "expert-parallel offsets");
  l_ = l;
  const int32_t* off = offsets.i32();
  const size_t P = static_cast<size_t>(P_);

  // 1. Counts: for each destination, rows per expert it owns.
  std::vector<int64_t> send_cnt(P * static_cast<size_t>(El_)), recv_cnt(send_cnt.size());
  for (int64_t e = 0; e < E_; ++e) send_cnt[static_cast<size_t>(e)] = off[e + 1] - off[e];
  {
    std::vector<int64_t> cnt(P, El_), displs(P);
    for (size_t i = 0; i < P; ++i) displs[i] = static_cast<int64_t>(i) * El_;
    ep_.iall_to_all_v(send_cnt.data(), cnt, displs, recv_cnt.data(), cnt, displs, Elem::I64).wait();
  }
  std::vector<int64_t> send_start(P), send_rows(P), recv_rows(P, 0);
  for (size_t d = 0; d < P; ++d) {
    send_start[d] = off[static_cast<int64_t>(d) * El_];
    send_rows[d] = off[static_cast<int64_t>(d + 1) * El_] - send_start[d];
    for (int64_t j = 0; j < El_; ++j) recv_rows[d] += recv_cnt[d * static_cast<size_t>(El_) + j];
  }

  // 2. The chunk plan, and the receive buffer laid out chunk by chunk, source by source.
  chunk_.clear();
  chunk_.resize(static_cast<size_t>(chunks_));
  int64_t pos = 0;
  for (int c = 0; c < chunks_; ++c) {
    Chunk& k = chunk_[static_cast<size_t>(c)];
    k.send_counts.resize(P);
    k.send_displs.resize(P);
    k.recv_counts.resize(P);
    k.recv_displs.resize(P);
    k.recv_begin = pos;
    std::vector<int64_t> count(static_cast<size_t>(El_), 0);
    std::vector<std::pair<int32_t, int32_t>> expert_row;  // (local expert, row in chunk)
    for (size_t s = 0; s < P; ++s) {
      const int64_t sb = piece_begin(send_rows[s], c, chunks_),
                    se = piece_begin(send_rows[s], c + 1, chunks_);
      k.send_counts[s] = (se - sb) * l;
      k.send_displs[s] = (send_start[s] + sb) * l;
      const int64_t rb = piece_begin(recv_rows[s], c, chunks_),
                    re = piece_begin(recv_rows[s], c + 1, chunks_);
      k.recv_counts[s] = (re - rb) * l;
      k.recv_displs[s] = pos * l;
      // Which local expert each received row belongs to: the source sent them in expert order.
      int64_t j = 0, end_j = recv_cnt[s * static_cast<size_t>(El_)];
      for (int64_t r = rb; r < re; ++r) {
        while (r >= end_j)
          end_j += recv_cnt[s * static_cast<size_t>(El_) + static_cast<size_t>(++j)];
        expert_row.emplace_back(static_cast<int32_t>(j), static_cast<int32_t>(pos - k.recv_begin));
        ++count[static_cast<size_t>(j)];
        ++pos;
      }
    }
    k.rows = pos - k.recv_begin;
    k.offsets = Tensor::empty({El_ + 1}, DType::I32);
    int32_t* ko = k.offsets.i32();
    ko[0] = 0;
    for (int64_t j = 0; j < El_; ++j)
      ko[j + 1] = ko[j] + static_cast<int32_t>(count[static_cast<size_t>(j)]);
    std::vector<int32_t> fill(ko, ko + El_);
    k.order.assign(static_cast<size_t>(k.rows), 0);
    for (const auto& [j, r] : expert_row)
      k.order[static_cast<size_t>(fill[static_cast<size_t>(j)]++)] = r;
  }
  recv_total_ = pos;
  rows_received_ += pos;

  // 3. Dispatch, compute as chunks land, return.
  Tensor recv = Tensor::empty({recv_total_, l}), back = Tensor::empty({recv_total_, l});
  exchange(rows, recv, back, out, [&](Chunk& k) {
    if (k.rows == 0) return;
    const ops::GroupedFfnParams q = local_params(p, k.rows);
    k.x = Tensor::empty({k.rows, l});
    const float* pr = recv.f32() + k.recv_begin * l;
    for (int64_t i = 0; i < k.rows; ++i)
      std::memcpy(k.x.f32() + i * l, pr + static_cast<int64_t>(k.order[static_cast<size_t>(i)]) * l,
                  sizeof(float) * static_cast<size_t>(l));
    ArenaPlan plan;
    ops::grouped_ffn_plan(q, plan);
    k.saved_mem = std::make_unique<Arena>(plan.bytes(), ctx.device(), "expert-parallel saved");
    k.saved = ops::grouped_ffn_alloc_saved(q, *k.saved_mem);
    Tensor y = Tensor::empty({k.rows, l});
    ops::grouped_ffn_forward(ctx, q, k.x, k.offsets, local, y, k.saved);
    float* pb = back.f32() + k.recv_begin * l;
    for (int64_t i = 0; i < k.rows; ++i)
      std::memcpy(pb + static_cast<int64_t>(k.order[static_cast<size_t>(i)]) * l, y.f32() + i * l,
                  sizeof(float) * static_cast<size_t>(l));
  });
}

void ExpertParallel::backward(Context& ctx, const ops::GroupedFfnParams& p,
                              const ops::GroupedFfnWeights& local, const Tensor& dout,
                              Tensor& drows, ops::GroupedFfnWeights& local_grads) {
  const int64_t N = p.rows, l = p.in;
  MT_CHECK(l == l_ && !chunk_.empty(), InternalError,
           "expert-parallel backward without a matching forward");
  expect_shape(dout, {N, l}, "expert-parallel dout");
  expect_shape(drows, {N, l}, "expert-parallel drows");
  Tensor recv = Tensor::empty({recv_total_, l}), back = Tensor::empty({recv_total_, l});
  exchange(dout, recv, back, drows, [&](Chunk& k) {
    if (k.rows == 0) return;
    const ops::GroupedFfnParams q = local_params(p, k.rows);
    Tensor dy = Tensor::empty({k.rows, l}), dx = Tensor::empty({k.rows, l});
    const float* pr = recv.f32() + k.recv_begin * l;
    for (int64_t i = 0; i < k.rows; ++i)
      std::memcpy(dy.f32() + i * l, pr + static_cast<int64_t>(k.order[static_cast<size_t>(i)]) * l,
                  sizeof(float) * static_cast<size_t>(l));
    ops::grouped_ffn_backward(ctx, q, k.x, k.offsets, local, k.saved, dy, dx, local_grads);
    float* pb = back.f32() + k.recv_begin * l;
    for (int64_t i = 0; i < k.rows; ++i)
      std::memcpy(pb + static_cast<int64_t>(k.order[static_cast<size_t>(i)]) * l, dx.f32() + i * l,
                  sizeof(float) * static_cast<size_t>(l));
  });
  // The saved activations are dead now; free them before the next layer's backward.
  for (Chunk& k : chunk_) {
    k.x = Tensor();
    k.saved = {};
    k.saved_mem.reset();
  }
}

}  // namespace mt::par
