#include "parallel/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/context.h"
#include "core/cuda/check.h"
#include "core/cuda/resources.h"
#include "parallel/cuda/spin.h"

namespace mt::par {

namespace {

using Clock = std::chrono::steady_clock;

// ncclInProgress is the normal answer of a nonblocking communicator; settle() waits it out.
#define MT_NCCL(where, call)                                                                   \
  do {                                                                                         \
    const ncclResult_t mt_nc_ = (call);                                                        \
    if (mt_nc_ != ncclSuccess && mt_nc_ != ncclInProgress)                                     \
      throw CommError(__FILE__, __LINE__,                                                      \
                      ::mt::cat(where, ": ", #call, " failed: ", ncclGetErrorString(mt_nc_))); \
  } while (0)

ncclDataType_t nccl_type(Elem e) {
  // In the order of Elem's enumerators.
  static constexpr ncclDataType_t kTypes[] = {ncclFloat32, ncclFloat64, ncclInt32, ncclInt64,
                                              ncclBfloat16};
  return kTypes[static_cast<int>(e)];
}

bool on_device(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unknown pointer is host memory; clear the sticky error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// The events one collective uses: `ready` on the compute stream; `start` and `done` on the
// communicator's, around the collective (timing events: their interval is its device time).
// Returned to the pool when both the watchdog (completion seen) and the Request (waited) let go,
// so an event is never re-recorded while someone may still wait on it.
struct Slot {
  cudaEvent_t ready = nullptr, start = nullptr, done = nullptr;
  int holds = 0;
};

struct Pending {
  Slot* slot;
  Collective coll;
  int64_t sent, recv;
  Clock::time_point t0;
};

class NcclComm;

class NcclRequest : public Request::Impl {
 public:
  NcclRequest(NcclComm& c, Slot* s) : comm_(c), slot_(s) {}
  ~NcclRequest() override;
  void wait() override;
  bool done() override;

 private:
  NcclComm& comm_;
  Slot* slot_;
};

class NcclComm : public Comm {
 public:
  NcclComm(Comm& boot, ncclComm_t comm, std::string name, int world_rank, int device,
           cudaStream_t compute, const CommOptions& opt)
      : boot_(boot),
        comm_(comm),
        name_(std::move(name)),
        world_rank_(world_rank),
        device_(device),
        compute_(compute),
        opt_(opt) {
    MT_NCCL(name_, ncclCommUserRank(comm_, &rank_));
    MT_NCCL(name_, ncclCommCount(comm_, &size_));
    // Serial (no overlap): the collectives queue behind and ahead of the compute in one stream.
    if (opt_.overlap)
      MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    else
      stream_ = compute_;
    MT_CUDA_CHECK(cudaEventCreate(&host_start_));
    MT_CUDA_CHECK(cudaEventCreate(&host_end_));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&host_done_, cudaEventDisableTiming));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    // Destructors cannot report: drain within the bound, finalise, or abort what is stuck.
    if (comm_) {
      // Drained when every event this communicator recorded has completed. Not a query of
      // stream_: serialised (overlap off), that is the context's compute stream, which the
      // context may already have destroyed (querying it crashed at exit).
      const auto drained = [this] {
        for (const auto& s : slots_)
          if (cudaEventQuery(s->done) != cudaSuccess) return false;
        return cudaEventQuery(host_done_) == cudaSuccess;
      };
      const auto t0 = Clock::now();
      while (!drained() && Clock::now() - t0 < opt_.timeout)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      const ncclResult_t fin = drained() ? ncclCommFinalize(comm_) : ncclInternalError;
      const bool clean = fin == ncclSuccess || fin == ncclInProgress;
      ncclResult_t st = ncclInProgress;
      while (clean && ncclCommGetAsyncError(comm_, &st) == ncclSuccess && st == ncclInProgress &&
             Clock::now() - t0 < opt_.timeout)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (clean && st == ncclSuccess)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    for (auto& s : slots_) {
      cudaEventDestroy(s->ready);
      cudaEventDestroy(s->start);
      cudaEventDestroy(s->done);
    }
    cudaEventDestroy(host_start_);
    cudaEventDestroy(host_end_);
    cudaEventDestroy(host_done_);
    if (stream_ != compute_) cudaStreamDestroy(stream_);
    if (dstage_) cudaFree(dstage_);
    if (hstage_) cudaFreeHost(hstage_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string where() const override {
    if (name_ == "world") return cat("nccl world rank ", rank_, "/", size_);
    return cat("nccl ", name_, " rank ", rank_, "/", size_, " (world rank ", world_rank_, ")");
  }
  Device memory() const override { return Device::CUDA; }
  void set_timeout(std::chrono::milliseconds t) override {
    std::lock_guard<std::mutex> lk(mu_);
    opt_.timeout = t;
  }
  void settle_stats() override {
    std::lock_guard<std::mutex> lk(mu_);
    reap_locked();
    for (int c = 0; c < kNumCollectives; ++c) {
      stats_.per[c].device_seconds += device_s_[c];
      device_s_[c] = 0;
    }
  }

  Request iall_reduce(void* data, int64_t count, Elem e) override {
    const int64_t b = count * static_cast<int64_t>(elem_size(e));
    auto run = [&](const void* s, void* r) {
      return ncclAllReduce(s, r, static_cast<size_t>(count), nccl_type(e), ncclSum, comm_, stream_);
    };
    if (!on_device(data)) return staged(Collective::AllReduce, data, b, data, b, run);
    return post(Collective::AllReduce, b, b, [&] { return run(data, data); });
  }
  Request iall_gather(const void* send, int64_t count, void* recv, Elem e) override {
    const int64_t b = count * static_cast<int64_t>(elem_size(e));
    auto run = [&](const void* s, void* r) {
      return ncclAllGather(s, r, static_cast<size_t>(count), nccl_type(e), comm_, stream_);
    };
    if (!pair_on_device(send, recv, "all_gather"))
      return staged(Collective::AllGather, send, b, recv, b * size_, run);
    return post(Collective::AllGather, b, b * size_, [&] { return run(send, recv); });
  }
  Request ireduce_scatter(const void* send, void* recv, int64_t count, Elem e) override {
    const int64_t b = count * static_cast<int64_t>(elem_size(e));
    auto run = [&](const void* s, void* r) {
      return ncclReduceScatter(s, r, static_cast<size_t>(count), nccl_type(e), ncclSum, comm_,
                               stream_);
    };
    if (!pair_on_device(send, recv, "reduce_scatter"))
      return staged(Collective::ReduceScatter, send, b * size_, recv, b, run);
    return post(Collective::ReduceScatter, b * size_, b, [&] { return run(send, recv); });
  }
  Request iall_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& send_displs, void* recv,
                        const std::vector<int64_t>& recv_counts,
                        const std::vector<int64_t>& recv_displs, Elem e) override {
    const size_t P = static_cast<size_t>(size_);
    check_peer_counts(send_counts, send_displs, recv_counts, recv_displs);
    const int64_t es = static_cast<int64_t>(elem_size(e));
    int64_t sb = 0, rb = 0, send_end = 0, recv_end = 0;
    for (size_t i = 0; i < P; ++i) {
      sb += send_counts[i] * es;
      rb += recv_counts[i] * es;
      send_end = std::max(send_end, (send_displs[i] + send_counts[i]) * es);
      recv_end = std::max(recv_end, (recv_displs[i] + recv_counts[i]) * es);
    }
    // NCCL has no all-to-all-v: one grouped send and receive per peer with rows to move.
    auto run = [&](const void* s, void* r) {
      MT_NCCL(where(), ncclGroupStart());
      for (size_t p = 0; p < P; ++p) {
        const int peer = static_cast<int>(p);
        if (send_counts[p] > 0)
          MT_NCCL(where(), ncclSend(static_cast<const char*>(s) + send_displs[p] * es,
                                    static_cast<size_t>(send_counts[p]), nccl_type(e), peer, comm_,
                                    stream_));
        if (recv_counts[p] > 0)
          MT_NCCL(where(), ncclRecv(static_cast<char*>(r) + recv_displs[p] * es,
                                    static_cast<size_t>(recv_counts[p]), nccl_type(e), peer, comm_,
                                    stream_));
      }
      return ncclGroupEnd();
    };
    if (!pair_on_device(send, recv, "all_to_all_v")) {
      // Only the received ranges come back, as MPI writes only those.
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (size_t p = 0; p < P; ++p) ranges.emplace_back(recv_displs[p] * es, recv_counts[p] * es);
      return staged(Collective::AllToAllV, send, send_end, recv, recv_end, run, sb, rb, &ranges);
    }
    return post(Collective::AllToAllV, sb, rb, [&] { return run(send, recv); });
  }
  Request ibroadcast(void* data, int64_t count, Elem e, int root) override {
    const int64_t b = count * static_cast<int64_t>(elem_size(e));
    auto run = [&](const void* s, void* r) {
      return ncclBroadcast(s, r, static_cast<size_t>(count), nccl_type(e), root, comm_, stream_);
    };
    const int64_t sent = rank_ == root ? b : 0, got = rank_ == root ? 0 : b;
    if (!on_device(data)) return staged(Collective::Broadcast, data, b, data, b, run, sent, got);
    return post(Collective::Broadcast, sent, got, [&] { return run(data, data); });
  }
  void barrier() override {
    int32_t one = 1;
    staged(Collective::Barrier, &one, 4, &one, 4, [&](const void* s, void* r) {
      return ncclAllReduce(s, r, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }

  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override {
    std::unique_lock<std::mutex> lk(mu_);
    throw_if_failed_locked();
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t sub = nullptr;
    MT_NCCL(where(), ncclCommSplit(comm_, color, key, &sub, &cfg));
    settle_locked(comm_, Collective::Barrier, 0, 0);
    settle_locked(sub, Collective::Barrier, 0, 0);
    return std::make_unique<NcclComm>(boot_, sub, name, world_rank_, device_, compute_, opt_);
  }
  [[noreturn]] void abort(int code) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    boot_.abort(code);
    std::_Exit(code);  // the bootstrap's abort does not return; this satisfies [[noreturn]]
  }

 private:
  friend class NcclRequest;

  // Enqueues `enqueue` (NCCL calls on stream_) after the compute stream's work so far, and
  // registers its completion with the watchdog.
  template <typename F>
  Request post(Collective c, int64_t sent, int64_t recv, F&& enqueue) {
    const auto t0 = Clock::now();
    std::unique_lock<std::mutex> lk(mu_);
    throw_if_failed_locked();
    count(c, sent, recv);
    Slot* s = take_slot_locked();
    MT_CUDA_CHECK(cudaEventRecord(s->ready, compute_));
    MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, s->ready, 0));
    MT_CUDA_CHECK(cudaEventRecord(s->start, stream_));
    if (opt_.simulated_us > 0) spin_on_stream(stream_, opt_.simulated_us);
    MT_NCCL(where(), enqueue());
    // A nonblocking communicator may still be launching; the event must follow the launch.
    settle_locked(comm_, c, sent, recv);
    MT_CUDA_CHECK(cudaEventRecord(s->done, stream_));
    pending_.push_back({s, c, sent, recv, Clock::now()});
    stats_.at(c).seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    lk.unlock();
    cv_.notify_one();
    return Request(std::make_unique<NcclRequest>(*this, s));
  }

  // Host memory: through the staging buffers, waiting (bounded) for the result.
  template <typename F>
  Request staged(Collective c, const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes,
                 F&& run, int64_t sent = -1, int64_t got = -1,
                 const std::vector<std::pair<int64_t, int64_t>>* ranges = nullptr) {
    const auto t0 = Clock::now();
    if (sent < 0) sent = send_bytes;
    if (got < 0) got = recv_bytes;
    std::unique_lock<std::mutex> lk(mu_);
    throw_if_failed_locked();
    count(c, sent, got);
    const size_t sb = static_cast<size_t>(send_bytes), rb = static_cast<size_t>(recv_bytes);
    const size_t recv_at = (sb + 255) / 256 * 256;
    reserve_stage_locked(recv_at + rb);
    char* d = static_cast<char*>(dstage_);
    char* h = static_cast<char*>(hstage_);
    // In place (the same host pointer both ways) uses one block, as NCCL's in-place forms do.
    const bool in_place = send == recv;
    char* dsend = d;
    char* drecv = in_place ? d : d + recv_at;
    if (sb > 0) {
      std::memcpy(h, send, sb);
      MT_CUDA_CHECK(cudaMemcpyAsync(dsend, h, sb, cudaMemcpyHostToDevice, stream_));
    }
    MT_CUDA_CHECK(cudaEventRecord(host_start_, stream_));
    if (opt_.simulated_us > 0) spin_on_stream(stream_, opt_.simulated_us);
    MT_NCCL(where(), run(dsend, drecv));
    settle_locked(comm_, c, sent, got);
    MT_CUDA_CHECK(cudaEventRecord(host_end_, stream_));
    char* hrecv = in_place ? h : h + recv_at;
    if (rb > 0) MT_CUDA_CHECK(cudaMemcpyAsync(hrecv, drecv, rb, cudaMemcpyDeviceToHost, stream_));
    MT_CUDA_CHECK(cudaEventRecord(host_done_, stream_));
    lk.unlock();
    host_wait(host_done_, c, sent, got);  // after host_end_ on the stream: both complete
    add_device_time(c, host_start_, host_end_);
    if (ranges) {
      for (const auto& [at, n] : *ranges)
        if (n > 0) std::memcpy(static_cast<char*>(recv) + at, hrecv + at, static_cast<size_t>(n));
    } else if (rb > 0) {
      std::memcpy(recv, hrecv, rb);
    }
    stats_.at(c).seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    return Request();
  }

  bool pair_on_device(const void* send, const void* recv, const char* what) const {
    const bool s = on_device(send), r = on_device(recv);
    MT_CHECK(s == r || send == nullptr || recv == nullptr, ValueError, where(), ": ", what,
             " with one buffer on the host and the other on the device");
    return s || r;
  }

  void count(Collective c, int64_t sent, int64_t recv) {
    CollectiveStats& s = stats_.at(c);
    ++s.calls;
    s.bytes_sent += sent;
    s.bytes_recv += recv;
  }

  Slot* take_slot_locked() {
    if (free_.empty()) {
      auto s = std::make_unique<Slot>();
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
      MT_CUDA_CHECK(cudaEventCreate(&s->start));
      MT_CUDA_CHECK(cudaEventCreate(&s->done));
      free_.push_back(s.get());
      slots_.push_back(std::move(s));
    }
    Slot* s = free_.back();
    free_.pop_back();
    s->holds = 2;  // the watchdog and the Request
    return s;
  }
  void release_locked(Slot* s) {
    if (--s->holds == 0) free_.push_back(s);
  }
  void release(Slot* s) {
    std::lock_guard<std::mutex> lk(mu_);
    release_locked(s);
  }

  void reserve_stage_locked(size_t bytes) {
    if (bytes <= stage_bytes_) return;
    // Staged calls wait for their result, so nothing in flight uses the old buffers.
    if (dstage_) MT_CUDA_CHECK(cudaFree(dstage_));
    if (hstage_) MT_CUDA_CHECK(cudaFreeHost(hstage_));
    dstage_ = hstage_ = nullptr;
    stage_bytes_ = std::max<size_t>(bytes, 4096);
    MT_CUDA_CHECK(cudaMalloc(&dstage_, stage_bytes_));
    MT_CUDA_CHECK(cudaMallocHost(&hstage_, stage_bytes_));
  }

  std::string report(Collective c, int64_t sent, int64_t recv) const {
    return cat(where(), ": ", collective_name(c), " (sending ", sent, " B, receiving ", recv,
               " B) did not complete within ", opt_.timeout.count(),
               " ms; a peer rank has failed or stalled; NCCL communicator aborted");
  }
  // Records the failure, says so at once (the main thread may be blocked elsewhere) and aborts
  // the communicator, which ends its kernels so that the streams waiting on them drain.
  void fail_locked(const std::string& msg) {
    if (!error_.empty()) return;
    error_ = msg;
    std::fprintf(stderr, "moetrain: %s\n", msg.c_str());
    std::fflush(stderr);
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  void throw_if_failed_locked() const {
    if (!error_.empty()) throw CommError(__FILE__, __LINE__, error_);
  }
  void throw_if_failed() {
    std::lock_guard<std::mutex> lk(mu_);
    throw_if_failed_locked();
  }

  // Waits out ncclInProgress of a nonblocking communicator, within the bound.
  void settle_locked(ncclComm_t comm, Collective c, int64_t sent, int64_t recv) {
    const auto t0 = Clock::now();
    for (;;) {
      ncclResult_t st = ncclSuccess;
      MT_NCCL(where(), ncclCommGetAsyncError(comm, &st));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        const std::string msg = cat(where(), ": ", collective_name(c), " (sending ", sent,
                                    " B, receiving ", recv, " B) failed: ", ncclGetErrorString(st));
        fail_locked(msg);
        throw CommError(__FILE__, __LINE__, msg);
      }
      if (Clock::now() - t0 > opt_.timeout) {
        fail_locked(report(c, sent, recv));
        throw_if_failed_locked();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void host_wait(cudaEvent_t ev, Collective c, int64_t sent, int64_t recv) {
    const auto t0 = Clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) MT_CUDA_CHECK(q);
      std::lock_guard<std::mutex> lk(mu_);
      throw_if_failed_locked();
      if (Clock::now() - t0 > opt_.timeout) {
        fail_locked(report(c, sent, recv));
        throw_if_failed_locked();
      }
      if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Adds the interval between two completed timing events to collective c's device time.
  void add_device_time(Collective c, cudaEvent_t from, cudaEvent_t to) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
      (void)cudaGetLastError();  // a measurement, not a failure: leave it out
      return;
    }
    std::lock_guard<std::mutex> lk(mu_);
    device_s_[static_cast<int>(c)] += ms * 1e-3;
  }

  // Retires the completed collectives at the front (in order on stream_), adding their device
  // times; returns the oldest one still running, or null.
  const Pending* reap_locked() {
    while (!pending_.empty()) {
      const Pending& p = pending_.front();
      if (cudaEventQuery(p.slot->done) != cudaSuccess) return &p;
      float ms = 0;
      if (cudaEventElapsedTime(&ms, p.slot->start, p.slot->done) == cudaSuccess)
        device_s_[static_cast<int>(p.coll)] += ms * 1e-3;
      else
        (void)cudaGetLastError();
      release_locked(p.slot);
      pending_.pop_front();
    }
    return nullptr;
  }

  // The watchdog: collectives complete in order on stream_, so the oldest pending one decides.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(10));
      if (!error_.empty()) continue;
      const Pending* p = reap_locked();
      if (p && Clock::now() - p->t0 > opt_.timeout) fail_locked(report(p->coll, p->sent, p->recv));
    }
  }

  Comm& boot_;
  ncclComm_t comm_;  // null once aborted
  std::string name_;
  int world_rank_, device_;
  cudaStream_t compute_, stream_ = nullptr;
  CommOptions opt_;
  int rank_ = 0, size_ = 1;
  // A staged call: start and end around its collective (timing), done after the copy back.
  cudaEvent_t host_start_ = nullptr, host_end_ = nullptr, host_done_ = nullptr;
  double device_s_[kNumCollectives] = {};  // device seconds of collectives retired since settled
  void* dstage_ = nullptr;  // device and pinned host staging, grown to the largest staged call
  void* hstage_ = nullptr;
  size_t stage_bytes_ = 0;

  std::mutex mu_;  // guards comm_, error_, the slots, pending_, stop_, device_s_
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<Slot*> free_;
  std::deque<Pending> pending_;
  std::string error_;
  bool stop_ = false;
  std::thread watchdog_;
};

NcclRequest::~NcclRequest() {
  if (slot_) comm_.release(slot_);
}

void NcclRequest::wait() {
  if (!slot_) return;
  comm_.throw_if_failed();
  MT_CUDA_CHECK(cudaStreamWaitEvent(comm_.compute_, slot_->done, 0));
  comm_.release(slot_);  // the event is re-recorded only after the watchdog has let go too
  slot_ = nullptr;
}

bool NcclRequest::done() {
  return !slot_ || cudaEventQuery(slot_->done) == cudaSuccess;
}

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, Context& ctx, const CommOptions& opt) {
  CudaResources& cr = cuda_resources(ctx);
  MT_CUDA_CHECK(cudaSetDevice(cr.device));
  ncclUniqueId id{};
  static_assert(sizeof id % 4 == 0, "the unique id travels as 32-bit words");
  if (bootstrap.rank() == 0) MT_NCCL(bootstrap.where(), ncclGetUniqueId(&id));
  bootstrap.broadcast(&id, sizeof id / 4, Elem::I32, 0);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // so that initialisation and every later call can be bounded and aborted
  ncclComm_t comm = nullptr;
  MT_NCCL(bootstrap.where(),
          ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &cfg));
  const auto t0 = Clock::now();
  for (;;) {
    ncclResult_t st = ncclSuccess;
    MT_NCCL(bootstrap.where(), ncclCommGetAsyncError(comm, &st));
    if (st == ncclSuccess) break;
    if (st != ncclInProgress || Clock::now() - t0 > opt.timeout) {
      ncclCommAbort(comm);
      throw CommError(
          __FILE__, __LINE__,
          cat(bootstrap.where(), ": NCCL initialisation of ", bootstrap.size(), " ranks on device ",
              cr.device,
              st == ncclInProgress ? cat(" did not complete within ", opt.timeout.count(), " ms")
                                   : cat(" failed: ", ncclGetErrorString(st))));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return std::make_unique<NcclComm>(bootstrap, comm, "world", bootstrap.rank(), cr.device,
                                    cr.stream, opt);
}

}  // namespace mt::par
