// Expert parallelism for one MoE layer (an ExpertCompute, src/model/moe_layer.h).
//
// The layer's rows arrive sorted by global expert, and rank p of the EP group owns the contiguous
// experts [p*El, (p+1)*El), so the rows bound for each destination are already one contiguous
// segment: the send buffer is the layer's own row buffer, nothing is packed. The layout (counts,
// pieces, sort order) is a DispatchLayout (dispatch_layout.h), the transport-independent part.
//
//   1. per-destination, per-expert row counts are exchanged (all-to-all of El counts per peer);
//   2. every segment is cut into `chunks` pieces; piece c of all segments travels in all-to-all-v
//      number c (rows at latent width l) into the shared DispatchBuffers, reserved once for the
//      worst case. All dispatches are posted at once;
//   3. as chunk c lands, its rows are ordered by local expert (stable in source order; a row
//      gather, ops::moe_gather, by the layout's order) and run as one grouped SwiGLU over the El
//      local experts; the outputs are unsorted (a gather by the inverse order) and sent back
//      (all-to-all-v, posted without waiting) while chunk c+1 computes;
//   4. backward reuses the same plan: the output gradients travel like the rows did, the
//      grouped backward runs per chunk on the saved inputs, input gradients travel back.
// A rank or an expert with zero rows is an empty segment; nothing special happens.
//
// One code path for both transports: the rows, the exchange buffers and the saved tensors live
// on the rows' device and in their dtype (host fp32 under MPI; the GPU, fp32 or bf16, under
// NCCL), every data movement is a Comm call or an op, and the counts and the layout stay host
// integers (NCCL stages the count exchange through host memory: one wait per MoE layer's
// forward; the chunks' sort indices then reach the GPU in one copy; docs/gpu.md).
#pragma once

#include <memory>
#include <vector>

#include "core/arena.h"
#include "model/moe_layer.h"
#include "parallel/comm.h"
#include "parallel/dispatch_layout.h"

namespace mt::par {

struct ExpertParallelOptions {
  int chunks = 1;  // all-to-all pieces pipelined with the expert computation
  // The most rows (tokens x top_k) a rank sends in one forward, for sizing the buffers once;
  // 0: the first forward's rows (ranks hold equal token counts, so that is every step's).
  int64_t max_rows = 0;
  // Shared by every layer of a model (one layer exchanges at a time); null: the layer's own.
  std::shared_ptr<DispatchBuffers> buffers;
};

class ExpertParallel : public ExpertCompute {
 public:
  ExpertParallel(Comm& ep, int64_t num_experts, const ExpertParallelOptions& opt);

  // What one forward keeps for its backward, one per micro-batch in flight (the MoE layer's
  // Saved holds it): the exchange's plan, and per chunk the rows sorted by local expert and the
  // grouped FFN's saved tensors, in one arena that the first forward sizes for the worst case
  // (every peer sending all its rows here) and later forwards reuse.
  struct State : ExpertState {
    State(int ranks, int64_t local_experts) : layout(ranks, local_experts) {}
    struct Chunk {
      Tensor x;        // sorted inputs
      Tensor offsets;  // i32 [El+1]: a view of the layout's offsets (host: the GEMMs launch per
                       // group from them)
      Tensor order, inverse;  // i32 [rows] on the rows' device: the sort and its inverse
      ops::GroupedFfnSaved ffn;
    };
    DispatchLayout layout;
    std::vector<Chunk> chunks;
    Arena mem;
    Device mem_device = Device::CPU;  // where mem lives
    // On a GPU: every chunk's order and inverse in one device buffer, filled by one copy from
    // index_host per forward (sized for the worst case, like the arena). Unused on the host, where
    // the chunks view the layout's own vectors.
    Tensor index;
    std::vector<int32_t> index_host;
    bool pending = false;  // a forward awaits its backward
  };
  std::unique_ptr<ExpertState> make_state() const override;
  void forward(Context& ctx, const ops::GroupedFfnParams& p, const Tensor& rows,
               const Tensor& offsets, const ops::GroupedFfnWeights& local, Tensor& out,
               ExpertState& st) override;
  void backward(Context& ctx, const ops::GroupedFfnParams& p, const ops::GroupedFfnWeights& local,
                const Tensor& dout, Tensor& drows, ops::GroupedFfnWeights& local_grads,
                ExpertState& st) override;

  // Rows (token-expert pairs) this rank's experts received, summed over forwards since reset.
  int64_t rows_received() const { return rows_received_; }
  // Chunk count from the next forward on (compensation, docs/load-balancing.md). Every rank of the
  // EP group must set the same count before the same forward; backward keeps its forward's plan.
  void set_chunks(int chunks);
  int chunks() const { return chunks_; }
  void reset_stats() { rows_received_ = 0; }
  const DispatchBuffers& buffers() const { return *buffers_; }

 private:
  ops::GroupedFfnParams local_params(const ops::GroupedFfnParams& p, int64_t rows) const;
  // Bytes of a state's arena for `chunks` chunks of at most `max_recv_rows` received rows of
  // dtype `at` on `device` (whose grouped-FFN saved layout it follows: ops/grouped_ffn.h pads h
  // and ha together on the GPU's K-concatenation path).
  size_t saved_capacity(const ops::GroupedFfnParams& p, int chunks, int64_t max_recv_rows, DType at,
                        Device device) const;
  // Points every chunk's order and inverse at index tensors on `device` (see State::index).
  static void bind_index(State& s, Device device, int64_t max_recv_rows);
  // Sends `src` ([N, l] in expert order) to the owners as `layout` says and passes what arrives
  // (`recv`, [R, l]) to `each(c)` as every chunk lands; `each` fills `back` ([R, l]), which
  // returns to `dst`.
  template <typename F>
  void exchange(const DispatchLayout& layout, const Tensor& src, const Tensor& recv,
                const Tensor& back, Tensor& dst, F&& each);

  Comm& ep_;
  int P_;
  int64_t E_, El_;
  int chunks_;
  int64_t max_rows_;
  std::shared_ptr<DispatchBuffers> buffers_;
  int64_t rows_received_ = 0;
  // Per-forward counts and requests, kept so that a step allocates nothing (one forward or
  // backward of this layer runs at a time; its micro-batch's own data is in the State).
  std::vector<int64_t> send_cnt_, recv_cnt_, cnt_, displs_;
  std::vector<Request> out_, ret_;
};

}  // namespace mt::par
