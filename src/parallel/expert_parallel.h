// Expert parallelism for one MoE layer (an ExpertCompute, src/model/moe_layer.h).
//
// The layer's rows arrive sorted by global expert, and rank p of the EP group owns the contiguous
// experts [p*El, (p+1)*El), so the rows bound for each destination are already one contiguous
// segment: the send buffer is the layer's own row buffer, nothing is packed.
//
//   1. per-destination, per-expert row counts are exchanged (all-to-all of El counts per peer);
//   2. every segment is cut into `chunks` pieces; piece c of all segments travels in all-to-all-v
//      number c (rows at latent width l). All dispatches are posted at once;
//   3. as chunk c lands, its rows are ordered by local expert (stable in source order) and run
//      as one grouped SwiGLU over the El local experts; the outputs are unsorted and sent back
//      (all-to-all-v, posted without waiting) while chunk c+1 computes;
//   4. backward reuses the same plan: the output gradients travel like the rows did, the
//      grouped backward runs per chunk on the saved inputs, input gradients travel back.
// A rank or an expert with zero rows is an empty segment; nothing special happens.
#pragma once

#include <memory>
#include <vector>

#include "core/arena.h"
#include "model/moe_layer.h"
#include "parallel/comm.h"

namespace mt::par {

struct ExpertParallelOptions {
  int chunks = 1;  // all-to-all pieces pipelined with the expert computation
};

class ExpertParallel : public ExpertCompute {
 public:
  ExpertParallel(Comm& ep, int64_t num_experts, const ExpertParallelOptions& opt);

  void forward(Context& ctx, const ops::GroupedFfnParams& p, const Tensor& rows,
               const Tensor& offsets, const ops::GroupedFfnWeights& local, Tensor& out) override;
  void backward(Context& ctx, const ops::GroupedFfnParams& p, const ops::GroupedFfnWeights& local,
                const Tensor& dout, Tensor& drows, ops::GroupedFfnWeights& local_grads) override;

  // Rows (token-expert pairs) this rank's experts received, summed over forwards since reset.
  int64_t rows_received() const { return rows_received_; }
  // Chunk count from the next forward on (compensation, docs/load-balancing.md). Every rank of the
  // EP group must set the same count before the same forward; backward keeps its forward's plan.
  void set_chunks(int chunks);
  int chunks() const { return chunks_; }
  void reset_stats() { rows_received_ = 0; }

 private:
  struct Chunk {
    // Element counts/displacements (rows * l) for sending our rows and receiving peers' rows.
    std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;
    int64_t recv_begin = 0, rows = 0;  // rows of this chunk in the receive buffer
    std::vector<int32_t> order;        // sorted position -> row within the chunk
    Tensor offsets;                    // i32 [El+1] over the sorted rows
    Tensor x;                          // sorted inputs, kept for backward
    std::unique_ptr<Arena> saved_mem;
    ops::GroupedFfnSaved saved;
  };
  ops::GroupedFfnParams local_params(const ops::GroupedFfnParams& p, int64_t rows) const;
  // Sends `src` ([N, l] in expert order) to the owners and returns what arrives ([R, l]) through
  // `each(c)` as every chunk lands; then sends `back` ([R, l]) to `dst` ([N, l]).
  template <typename F>
  void exchange(const Tensor& src, Tensor& recv, Tensor& back, Tensor& dst, F&& each);

  Comm& ep_;
  int P_;
  int64_t E_, El_;
  int chunks_;
  int64_t l_ = 0, recv_total_ = 0;
  std::vector<Chunk> chunk_;
  int64_t rows_received_ = 0;
};

}  // namespace mt::par
