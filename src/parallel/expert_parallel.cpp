#include "parallel/expert_parallel.h"

#include <algorithm>
#include <string>

#include "ops/moe_dispatch.h"
#include "ops/moe_rules.h"

namespace mt::par {

namespace {

int64_t local_experts(const Comm& ep, int64_t num_experts) {
  const std::string bad = ops::expert_parallel_error(ep.size(), num_experts);
  MT_CHECK(bad.empty() && num_experts > 0, ConfigError, "expert parallelism over ", ep.where(),
           ": ", bad.empty() ? cat("no routed experts (", num_experts, ")") : bad);
  return num_experts / ep.size();
}

}  // namespace

ExpertParallel::ExpertParallel(Comm& ep, int64_t num_experts, const ExpertParallelOptions& opt)
    : ep_(ep),
      P_(ep.size()),
      E_(num_experts),
      El_(local_experts(ep, num_experts)),
      chunks_(opt.chunks),
      max_rows_(opt.max_rows),
      buffers_(opt.buffers ? opt.buffers : std::make_shared<DispatchBuffers>()) {
  MT_CHECK(opt.chunks >= 1, ConfigError, "all-to-all chunks must be >= 1, got ", opt.chunks);
  // The count exchange's layout never changes: El counts to and from every peer.
  cnt_.assign(static_cast<size_t>(P_), El_);
  displs_.resize(static_cast<size_t>(P_));
  for (int i = 0; i < P_; ++i) displs_[static_cast<size_t>(i)] = i * El_;
}

std::unique_ptr<ExpertState> ExpertParallel::make_state() const {
  return std::make_unique<State>(P_, El_);
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

size_t ExpertParallel::saved_capacity(const ops::GroupedFfnParams& p, int chunks,
                                      int64_t max_recv_rows, DType at, Device device) const {
  // A chunk takes at most ceil(rows / chunks) of every source's rows (DispatchLayout::reserve).
  const int64_t rows = std::min(max_recv_rows, max_recv_rows / chunks + P_);
  ArenaPlan plan(at, device);
  for (int c = 0; c < chunks; ++c) {
    plan.add({rows, p.in});
    ops::grouped_ffn_plan(local_params(p, rows), plan);
  }
  return plan.bytes();
}

void ExpertParallel::bind_index(State& s, Device device, int64_t max_recv_rows) {
  const std::vector<DispatchChunk>& chunks = s.layout.chunks();
  if (device == Device::CPU) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      const DispatchChunk& k = chunks[c];
      if (k.rows == 0) continue;
      s.chunks[c].order = Tensor(const_cast<int32_t*>(k.order.data()), {k.rows}, DType::I32);
      s.chunks[c].inverse = Tensor(const_cast<int32_t*>(k.inverse.data()), {k.rows}, DType::I32);
    }
    return;
  }
  const int64_t n = 2 * s.layout.recv_rows();
  if (!s.index.defined() || s.index.device() != device || s.index.numel() < n) {
    const int64_t cap = std::max<int64_t>({2 * max_recv_rows, n, 1});
    s.index = Tensor::empty({cap}, DType::I32, device);
    s.index_host.reserve(static_cast<size_t>(cap));
  }
  s.index_host.clear();
  for (const DispatchChunk& k : chunks) {
    s.index_host.insert(s.index_host.end(), k.order.begin(), k.order.end());
    s.index_host.insert(s.index_host.end(), k.inverse.begin(), k.inverse.end());
  }
  if (n == 0) return;
  s.index.rows(0, n).copy_from(Tensor(s.index_host.data(), {n}, DType::I32));
  int64_t at = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const int64_t r = chunks[c].rows;
    if (r == 0) continue;
    s.chunks[c].order = s.index.rows(at, at + r);
    s.chunks[c].inverse = s.index.rows(at + r, at + 2 * r);
    at += 2 * r;
  }
}

template <typename F>
void ExpertParallel::exchange(const DispatchLayout& layout, const Tensor& src, const Tensor& recv,
                              const Tensor& back, Tensor& dst, F&& each) {
  // The plan's own chunks: a set_chunks between forward and backward must not change backward.
  const std::vector<DispatchChunk>& chunks = layout.chunks();
  const size_t n = chunks.size();
  const Elem e = elem_of(src.dtype());
  std::vector<Request>&out = out_, &ret = ret_;
  out.resize(n);
  ret.resize(n);
  for (size_t c = 0; c < n; ++c) {
    const DispatchChunk& k = chunks[c];
    out[c] = ep_.iall_to_all_v(src.raw(), k.send_counts, k.send_displs, recv.raw(), k.recv_counts,
                               k.recv_displs, e);
  }
  for (size_t c = 0; c < n; ++c) {
    const DispatchChunk& k = chunks[c];
    out[c].wait();
    if (k.rows > 0) each(c, k);
    // The way back mirrors the way out: our receive layout becomes the send layout.
    ret[c] = ep_.iall_to_all_v(back.raw(), k.recv_counts, k.recv_displs, dst.raw(), k.send_counts,
                               k.send_displs, e);
  }
  for (Request& r : ret) r.wait();
}

void ExpertParallel::forward(Context& ctx, const ops::GroupedFfnParams& p, const Tensor& rows,
                             const Tensor& offsets, const ops::GroupedFfnWeights& local,
                             Tensor& out, ExpertState& st) {
  State& s = state_as<State>(st, "expert-parallel forward");
  const int64_t N = p.rows, l = p.in;
  expect_shape(rows, {N, l}, "expert-parallel rows");
  expect_shape(out, {N, l}, "expert-parallel output");
  expect_shape(offsets, {E_ + 1}, "expert-parallel offsets");
  MT_CHECK(offsets.device() == Device::CPU, ValueError,
           "expert-parallel offsets must be host memory (the layer's host copy on a GPU), got ",
           device_name(offsets.device()));
  MT_CHECK(rows.device() == out.device() && rows.dtype() == out.dtype(), ValueError,
           "expert-parallel rows (", device_name(rows.device()), ", ", dtype_name(rows.dtype()),
           ") and output (", device_name(out.device()), ", ", dtype_name(out.dtype()),
           ") differ in device or dtype");
  MT_CHECK(s.layout.ranks() == P_ && s.layout.local_experts() == El_, ValueError,
           "expert-parallel forward: a state for ", s.layout.ranks(), " ranks x ",
           s.layout.local_experts(), " local experts, this group has ", P_, " x ", El_);
  const int32_t* off = offsets.i32();
  const DType at = rows.dtype();
  const Device dev = rows.device();

  // 1. Counts: for each destination, rows per expert it owns. Host integers on either transport
  // (NCCL stages them: the forward's one wait for the exchange).
  s.layout.send_counts(off, send_cnt_);
  recv_cnt_.resize(send_cnt_.size());
  ep_.iall_to_all_v(send_cnt_.data(), cnt_, displs_, recv_cnt_.data(), cnt_, displs_, Elem::I64)
      .wait();

  // 2. The chunk plan, and buffers for the worst case (reserved once).
  max_rows_ = std::max(max_rows_, N);  // only a forward beyond the hint grows the buffers
  const int64_t worst = DispatchLayout::recv_capacity(P_, max_rows_);
  s.layout.reserve(chunks_, worst);
  s.layout.plan(off, recv_cnt_, chunks_, l);
  const int64_t R = s.layout.recv_rows();
  rows_received_ += R;
  buffers_->reserve(std::max(worst, R), l, at, dev);

  // 3. What backward reads, per chunk, from the state's arena: sized for the worst case of this
  // chunk count once, and kept, so that the steps after the first allocate nothing.
  const std::vector<DispatchChunk>& chunks = s.layout.chunks();
  ArenaPlan plan(at, dev);  // the saved layout depends on the device (grouped_ffn_alloc_saved)
  for (const DispatchChunk& k : chunks) {
    plan.add({k.rows, l});
    ops::grouped_ffn_plan(local_params(p, k.rows), plan);
  }
  if (plan.bytes() > s.mem.capacity() || s.mem_device != dev) {
    s.mem = Arena(
        std::max(plan.bytes(), saved_capacity(p, static_cast<int>(chunks.size()), worst, at, dev)),
        dev, "expert-parallel saved");
    s.mem_device = dev;
  }
  s.mem.reset();
  s.chunks.resize(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    State::Chunk& sc = s.chunks[c];
    const DispatchChunk& k = chunks[c];
    sc.x = s.mem.alloc({k.rows, l}, at);
    sc.ffn = ops::grouped_ffn_alloc_saved(local_params(p, k.rows), s.mem, at);
    // The layout keeps its offsets until the state's next forward, after this backward.
    sc.offsets = Tensor(const_cast<int32_t*>(k.offsets.data()), {El_ + 1}, DType::I32);
  }
  bind_index(s, dev, worst);

  // 4. Dispatch, compute as chunks land, return.
  const Tensor recv = buffers_->get(DispatchBuffers::kRecv, R, l),
               back = buffers_->get(DispatchBuffers::kBack, R, l);
  exchange(s.layout, rows, recv, back, out, [&](size_t c, const DispatchChunk& k) {
    State::Chunk& sc = s.chunks[c];
    const int64_t b = k.recv_begin, e = k.recv_begin + k.rows;
    ops::moe_gather(ctx, recv.rows(b, e), sc.order, 1, sc.x);
    Tensor y = buffers_->get(DispatchBuffers::kSortedA, k.rows, l);
    ops::grouped_ffn_forward(ctx, local_params(p, k.rows), sc.x, sc.offsets, local, y, sc.ffn);
    Tensor to = back.rows(b, e);
    ops::moe_gather(ctx, y, sc.inverse, 1, to);
  });
  s.pending = true;
}

void ExpertParallel::backward(Context& ctx, const ops::GroupedFfnParams& p,
                              const ops::GroupedFfnWeights& local, const Tensor& dout,
                              Tensor& drows, ops::GroupedFfnWeights& local_grads, ExpertState& st) {
  State& s = state_as<State>(st, "expert-parallel backward");
  const int64_t N = p.rows, l = p.in;
  MT_CHECK(s.pending && s.layout.planned() && l == s.layout.width() && N == s.layout.send_rows(),
           InternalError, "expert-parallel backward without a matching forward");
  expect_shape(dout, {N, l}, "expert-parallel dout");
  expect_shape(drows, {N, l}, "expert-parallel drows");
  const int64_t R = s.layout.recv_rows();
  const Tensor recv = buffers_->get(DispatchBuffers::kRecv, R, l),
               back = buffers_->get(DispatchBuffers::kBack, R, l);
  // The chunks add into the same expert gradients: only the first may find them zero.
  bool grads_zero = p.weight_grads_zero;
  exchange(s.layout, dout, recv, back, drows, [&](size_t c, const DispatchChunk& k) {
    State::Chunk& sc = s.chunks[c];
    const int64_t b = k.recv_begin, e = k.recv_begin + k.rows;
    Tensor dy = buffers_->get(DispatchBuffers::kSortedA, k.rows, l),
           dx = buffers_->get(DispatchBuffers::kSortedB, k.rows, l);
    ops::moe_gather(ctx, recv.rows(b, e), sc.order, 1, dy);
    ops::GroupedFfnParams cp = local_params(p, k.rows);
    cp.weight_grads_zero = grads_zero;
    grads_zero = false;
    ops::grouped_ffn_backward(ctx, cp, sc.x, sc.offsets, local, sc.ffn, dy, dx, local_grads);
    Tensor to = back.rows(b, e);
    ops::moe_gather(ctx, dx, sc.inverse, 1, to);
  });
  // The saved rows are dead now: their pages go back to the system before the next layer's
  // backward, so that they do not stay resident through the optimizer step (the planner's peak
  // counts them until here); the allocation stays for the next forward.
  s.chunks.clear();
  s.mem.discard();
  s.pending = false;
}

}  // namespace mt::par
