#include "parallel/dispatch_layout.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace mt::par {

namespace {

// Piece boundaries: chunk c of n rows is [n*c/chunks, n*(c+1)/chunks), sizes differing by <= 1.
int64_t piece_begin(int64_t n, int c, int chunks) {
  return n * c / chunks;
}

}  // namespace

DispatchLayout::DispatchLayout(int ranks, int64_t local_experts) : P_(ranks), El_(local_experts) {
  MT_CHECK(ranks >= 1 && local_experts >= 1, ConfigError, "dispatch layout of ", ranks,
           " ranks with ", local_experts, " local experts");
}

void DispatchLayout::send_counts(const int32_t* offsets, std::vector<int64_t>& out) const {
  out.resize(static_cast<size_t>(P_ * El_));
  for (size_t e = 0; e < out.size(); ++e) out[e] = offsets[e + 1] - offsets[e];
}

void DispatchLayout::reserve(int chunks, int64_t max_recv_rows) {
  // A chunk takes at most ceil(rows / chunks) of every source's rows.
  const int64_t per_chunk = std::min(max_recv_rows, max_recv_rows / chunks + P_);
  const size_t P = static_cast<size_t>(P_), El = static_cast<size_t>(El_);
  if (chunks_.size() < static_cast<size_t>(chunks)) chunks_.resize(static_cast<size_t>(chunks));
  for (DispatchChunk& k : chunks_) {
    for (auto* v : {&k.send_counts, &k.send_displs, &k.recv_counts, &k.recv_displs}) v->reserve(P);
    k.order.reserve(static_cast<size_t>(per_chunk));
    k.inverse.reserve(static_cast<size_t>(per_chunk));
    k.offsets.reserve(El + 1);
  }
  for (auto* v : {&send_start_, &send_rows_, &recv_rows_}) v->reserve(P);
  count_.reserve(El);
  fill_.reserve(El);
  expert_row_.reserve(static_cast<size_t>(per_chunk));
}

void DispatchLayout::plan(const int32_t* offsets, const std::vector<int64_t>& recv_counts,
                          int chunks, int64_t width) {
  const size_t P = static_cast<size_t>(P_), El = static_cast<size_t>(El_);
  MT_CHECK(chunks >= 1, ConfigError, "all-to-all chunks must be >= 1, got ", chunks);
  MT_CHECK(recv_counts.size() == P * El, ShapeError,
           "dispatch receive counts: ", recv_counts.size(),
           " entries, expected ranks x local experts = ", P * El);
  width_ = width;
  std::vector<int64_t>&send_start = send_start_, &send_rows = send_rows_, &recv_rows = recv_rows_;
  send_start.assign(P, 0);
  send_rows.assign(P, 0);
  recv_rows.assign(P, 0);
  for (size_t d = 0; d < P; ++d) {
    send_start[d] = offsets[d * El];
    send_rows[d] = offsets[(d + 1) * El] - send_start[d];
    for (size_t j = 0; j < El; ++j) {
      MT_CHECK(recv_counts[d * El + j] >= 0, ValueError, "dispatch: rank ", d, " sends ",
               recv_counts[d * El + j], " rows to local expert ", j);
      recv_rows[d] += recv_counts[d * El + j];
    }
  }
  send_total_ = offsets[P * El] - offsets[0];

  // Resized, not cleared: the chunks keep their vectors' storage from the last plan.
  chunks_.resize(static_cast<size_t>(chunks));
  int64_t pos = 0;
  std::vector<int64_t>& count = count_;
  count.assign(El, 0);
  std::vector<std::pair<int32_t, int32_t>>& expert_row = expert_row_;
  for (int c = 0; c < chunks; ++c) {
    DispatchChunk& k = chunks_[static_cast<size_t>(c)];
    k.send_counts.resize(P);
    k.send_displs.resize(P);
    k.recv_counts.resize(P);
    k.recv_displs.resize(P);
    k.recv_begin = pos;
    std::fill(count.begin(), count.end(), 0);
    expert_row.clear();
    for (size_t s = 0; s < P; ++s) {
      const int64_t sb = piece_begin(send_rows[s], c, chunks),
                    se = piece_begin(send_rows[s], c + 1, chunks);
      k.send_counts[s] = (se - sb) * width;
      k.send_displs[s] = (send_start[s] + sb) * width;
      const int64_t rb = piece_begin(recv_rows[s], c, chunks),
                    re = piece_begin(recv_rows[s], c + 1, chunks);
      k.recv_counts[s] = (re - rb) * width;
      k.recv_displs[s] = pos * width;
      // Which local expert each received row belongs to: the source sent them in expert order.
      size_t j = 0;
      int64_t end_j = recv_counts[s * El];
      for (int64_t r = rb; r < re; ++r) {
        while (r >= end_j) end_j += recv_counts[s * El + ++j];
        expert_row.emplace_back(static_cast<int32_t>(j), static_cast<int32_t>(pos - k.recv_begin));
        ++count[j];
        ++pos;
      }
    }
    k.rows = pos - k.recv_begin;
    k.offsets.assign(El + 1, 0);
    for (size_t j = 0; j < El; ++j)
      k.offsets[j + 1] = k.offsets[j] + static_cast<int32_t>(count[j]);
    std::vector<int32_t>& fill = fill_;
    fill.assign(k.offsets.begin(), k.offsets.end() - 1);
    k.order.assign(static_cast<size_t>(k.rows), 0);
    k.inverse.assign(static_cast<size_t>(k.rows), 0);
    for (const auto& [j, r] : expert_row) {
      const int32_t at = fill[static_cast<size_t>(j)]++;
      k.order[static_cast<size_t>(at)] = r;
      k.inverse[static_cast<size_t>(r)] = at;
    }
  }
  recv_total_ = pos;
  planned_ = true;
}

void DispatchBuffers::reserve(int64_t rows, int64_t width, DType dtype, Device device) {
  MT_CHECK(rows >= 0 && width >= 1, ValueError, "dispatch buffers of ", rows, " rows x ", width);
  const bool same = block_.defined() && block_.dtype() == dtype && block_.device() == device;
  if (same && rows * width <= capacity_) return;
  capacity_ = std::max(rows * width, same ? capacity_ : int64_t{0});
  block_ = Tensor::empty({kBuffers * capacity_}, dtype, device);
  ++allocations_;
}

Tensor DispatchBuffers::get(int which, int64_t rows, int64_t width) const {
  MT_CHECK(rows * width <= capacity_, InternalError, "dispatch buffer of ", rows, " x ", width,
           " beyond its reserved ", capacity_, " elements");
  return block_.rows(which * capacity_, which * capacity_ + rows * width).view({rows, width});
}

}  // namespace mt::par
