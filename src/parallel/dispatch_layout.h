// The layout of one expert-parallel dispatch and its combine, independent of the transport: the
// same plan drives MPI's all-to-all-v on host buffers and NCCL's grouped send/recv on device
// buffers, so the multi-rank MPI tests exercise the code the GPU path runs.
//
// Rank p of an EP group of P ranks owns the local experts [p*El, (p+1)*El). A rank's rows arrive
// sorted by global expert, so the rows bound for each destination are one contiguous segment of
// its row buffer (nothing is packed). Every segment is cut into `chunks` pieces of near-equal
// size; piece c of every segment travels in exchange c:
//
//   send buffer (N rows)        | seg->0 | seg->1 | ... |         the layer's own rows
//   receive buffer (R rows)     | chunk 0: from 0, from 1, ... | chunk 1: ... |
//   chunk c, sorted             rows grouped by local expert, stable in arrival order
//
// The way back (combine) mirrors the way out with send and receive swapped, and backward reuses
// the forward's plan unchanged (the backward of a dispatch is a combine), so nothing is planned
// twice. Counts are host integers: NCCL's send/recv and MPI's all-to-all-v both take host counts.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mt::par {

struct DispatchChunk {
  // Element counts and displacements (rows x width), one per peer: what this rank sends of the
  // send buffer and receives into the receive buffer.
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;
  int64_t recv_begin = 0, rows = 0;  // this chunk's rows in the receive buffer
  std::vector<int32_t> order;        // sorted position -> row within the chunk
  std::vector<int32_t> inverse;      // row within the chunk -> sorted position
  std::vector<int32_t> offsets;      // [El+1] over the sorted rows
};

class DispatchLayout {
 public:
  DispatchLayout(int ranks, int64_t local_experts);

  // The receive buffer's worst case when no rank sends more than `max_rows_per_rank` rows: every
  // peer sends all of them here. Buffers sized from it once fit every dispatch.
  static int64_t recv_capacity(int ranks, int64_t max_rows_per_rank) {
    return ranks * max_rows_per_rank;
  }

  // This rank's rows per (destination, local expert), [P*El], from the offsets over all P*El
  // experts ([P*El + 1]); what the count exchange sends.
  void send_counts(const int32_t* offsets, std::vector<int64_t>& out) const;

  // Sizes the plan's own vectors for `chunks` chunks of at most `max_recv_rows` received rows in
  // all, so that plan() allocates nothing while its arguments stay within these bounds.
  void reserve(int chunks, int64_t max_recv_rows);

  // Plans the exchange of rows `width` elements wide. `offsets` as above; `recv_counts` [P*El]:
  // the rows each source sends per local expert of this rank (the count exchange's result).
  void plan(const int32_t* offsets, const std::vector<int64_t>& recv_counts, int chunks,
            int64_t width);

  int ranks() const { return P_; }
  int64_t local_experts() const { return El_; }
  int64_t width() const { return width_; }
  int64_t send_rows() const { return send_total_; }
  int64_t recv_rows() const { return recv_total_; }
  bool planned() const { return planned_; }
  const std::vector<DispatchChunk>& chunks() const { return chunks_; }

 private:
  int P_;
  int64_t El_, width_ = 0, send_total_ = 0, recv_total_ = 0;
  bool planned_ = false;
  std::vector<DispatchChunk> chunks_;
  // plan()'s scratch, kept for the next plan: per peer, per local expert, per received row.
  std::vector<int64_t> send_start_, send_rows_, recv_rows_, count_;
  std::vector<int32_t> fill_;
  std::vector<std::pair<int32_t, int32_t>> expert_row_;  // (local expert, row in chunk)
};

// The exchange's data buffers: receive, return and two scratch blocks for the rows sorted by
// local expert, each [rows, width] in the rows' dtype, on the rows' device (host memory for MPI,
// the GPU for NCCL). Sized from the worst case (recv_capacity) and shared by every MoE layer of a
// model, as only one layer exchanges at a time; reserve() allocates only when asked for more than
// ever before (or another dtype or device), so a step with the hinted sizes allocates nothing.
class DispatchBuffers {
 public:
  enum Which { kRecv = 0, kBack = 1, kSortedA = 2, kSortedB = 3 };
  void reserve(int64_t rows, int64_t width, DType dtype = DType::F32, Device device = Device::CPU);
  // [rows, width] at the start of buffer `which`; rows * width within the reserve.
  Tensor get(int which, int64_t rows, int64_t width) const;
  int allocations() const { return allocations_; }
  int64_t bytes() const {
    return block_.defined() ? static_cast<int64_t>(block_.bytes()) : int64_t{0};
  }

 private:
  static constexpr int64_t kBuffers = 4;
  int64_t capacity_ = 0;  // elements per buffer
  int allocations_ = 0;
  Tensor block_;
};

}  // namespace mt::par
