// Comm: the collectives distributed training needs, behind one interface so that the same trainer
// code runs on MPI (CPU processes), on a single process (world 1, no MPI calls at all) and later on
// NCCL. Every collective has an asynchronous form returning a Request; every wait is bounded by
// the communicator's timeout and, when it expires (or MPI reports the failure), throws CommError
// naming the rank, the collective, its sizes and the peers found dead or stopped, so a dead peer
// turns into an error instead of a hang. The ranks' process ids are exchanged when the world is
// made; a peer on the same host is dead when its process is gone or a zombie (SIGKILL) and
// stopped when it is in state T (SIGSTOP); one on another host is reported as unknown.
//
// Fault injection (tests, docs/reliability.md; read where the world is made): with
// MOETRAIN_FAULT_KILL_RANK=R, MOETRAIN_FAULT_KILL_IN=<collective name> and
// MOETRAIN_FAULT_KILL_CALL=N, world rank R SIGKILLs itself as it starts its N-th call (1-based) of
// that collective on any communicator, so its peers are inside the same collective when it dies.
// MOETRAIN_FAULT_SIGNAL=STOP sends SIGSTOP instead: the rank stops answering without dying (the
// peers' bounded waits report it as stopped; their abort ends it).
//
// The primitive calls take host pointers with element counts: collectives move flat shards and
// slices of rows, and the counts of an all-to-all-v vary per peer. The Tensor forms take the
// element type from the tensor's dtype and check that the tensors are contiguous host memory.
// bf16 (Elem::BF16) moves as 16-bit words; its sums (all_reduce, reduce_scatter) add in fp32 and
// round to bf16 at every combine, as NCCL's bf16 reductions do, so a sum of W values may differ
// from the fp32 sum rounded once by up to W - 1 bf16 roundings.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace mt::par {

class CommError : public Error {
 public:
  CommError(const char* file, int line, const std::string& msg)
      : Error("CommError", file, line, msg) {}
};

enum class Elem { F32, F64, I32, I64, BF16 };
size_t elem_size(Elem e);
// The element type of a tensor's dtype (every DType has one).
Elem elem_of(DType d);

enum class Collective { AllGather, ReduceScatter, AllReduce, AllToAllV, Broadcast, Barrier };
inline constexpr int kNumCollectives = 6;
const char* collective_name(Collective c);

// Per-collective counters since the last reset. `seconds` is wall time spent inside the calls
// and waits of this communicator; `idle_seconds` the part of the waits spent on requests that
// had not completed when the wait began (time the rank sat waiting for its peers).
// `device_seconds` is the time the collectives took where they ran, filled by settle_stats():
// on NCCL the sum of CUDA event intervals around each collective on its stream (the simulated
// delay included), on MPI and the local comm the host seconds.
struct CollectiveStats {
  int64_t calls = 0, bytes_sent = 0, bytes_recv = 0;
  double seconds = 0, idle_seconds = 0, device_seconds = 0;
  CollectiveStats& operator+=(const CollectiveStats& o);
};
struct CommStats {
  CollectiveStats per[kNumCollectives];
  CollectiveStats& at(Collective c) { return per[static_cast<int>(c)]; }
  const CollectiveStats& at(Collective c) const { return per[static_cast<int>(c)]; }
  CollectiveStats total() const;
};

struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // job key parallel.comm_timeout_s
  // NCCL only, for measuring overlap at world 1 (env MOETRAIN_SIM_COMM_US, read by DistSetup):
  // a spin kernel of this many microseconds runs on the collective's stream before each
  // collective, as a slow peer would hold it.
  int64_t simulated_us = 0;
  // NCCL only: false runs every collective on the compute stream (env MOETRAIN_COMM_OVERLAP=0),
  // the serial baseline against which overlap is measured.
  bool overlap = true;
};

// A pending collective. wait() completes it (or throws CommError after the timeout); a Request
// destroyed unwaited waits in its destructor, swallowing errors, so buffers are never left in use.
// A timed-out collective is abandoned, not waited for (that would be the hang): a late peer could
// still write its buffers, so after a CommError the rank must end the job (Comm::abort).
class Request {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual void wait() = 0;
    virtual bool done() = 0;
    // Called once the Request lets go of it: a communicator may keep it for its next collective,
    // so that a step after warm-up allocates none.
    virtual void recycle() { delete this; }
  };
  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(impl.release()) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& o) noexcept;
  ~Request();
  void wait();
  bool pending() const { return impl_ != nullptr; }
  // Drives progress without blocking (MPI_Test): nonblocking MPI collectives advance only inside
  // MPI calls when no progress thread runs. True when complete (or empty); wait() still required.
  bool test() { return !impl_ || impl_->done(); }

 private:
  struct Recycle {
    void operator()(Impl* p) const { p->recycle(); }
  };
  std::unique_ptr<Impl, Recycle> impl_;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Short description for messages: "world rank 2/4" or "ep group rank 1/2 (world rank 3)".
  virtual std::string where() const = 0;

  // Sum in place over all ranks.
  virtual Request iall_reduce(void* data, int64_t count, Elem e) = 0;
  // recv[r*count .. (r+1)*count) = rank r's send.
  virtual Request iall_gather(const void* send, int64_t count, void* recv, Elem e) = 0;
  // recv = the sum over ranks of send[rank()*count .. (rank()+1)*count); send has size()*count.
  virtual Request ireduce_scatter(const void* send, void* recv, int64_t count, Elem e) = 0;
  // Counts and displacements are in elements, one per peer.
  virtual Request iall_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& send_displs, void* recv,
                                const std::vector<int64_t>& recv_counts,
                                const std::vector<int64_t>& recv_displs, Elem e) = 0;
  virtual Request ibroadcast(void* data, int64_t count, Elem e, int root) = 0;
  virtual void barrier() = 0;

  // A sub-communicator of the ranks passing the same colour, ordered by key. Collective.
  virtual std::unique_ptr<Comm> split(int color, int key, const std::string& name) = 0;
  // Ends every process of the job (MPI_Abort); for a rank that cannot continue.
  [[noreturn]] virtual void abort(int code) = 0;
  // The bound of every wait from now on; communicators split later inherit it. Not collective.
  virtual void set_timeout(std::chrono::milliseconds timeout) { (void)timeout; }
  // Where the Tensor forms' tensors live: host memory for MPI and the local comm, the GPU for NCCL.
  virtual Device memory() const { return Device::CPU; }

  // Tensor forms (element type from the dtype, counts from the shapes).
  // In place: t = the sum of every rank's t.
  Request iall_reduce(Tensor& t);
  // recv ([size() * n]) = every rank's send ([n]), in rank order.
  Request iall_gather(const Tensor& send, Tensor& recv);
  // recv ([n]) = the sum over ranks of send's slice rank() ([size() * n] elements).
  Request ireduce_scatter(const Tensor& send, Tensor& recv);
  // Counts and displacements in elements of the tensors, one per peer.
  Request iall_to_all_v(const Tensor& send, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& send_displs, Tensor& recv,
                        const std::vector<int64_t>& recv_counts,
                        const std::vector<int64_t>& recv_displs);
  Request ibroadcast(Tensor& t, int root);

  // Blocking forms.
  void all_reduce(void* data, int64_t count, Elem e) { iall_reduce(data, count, e).wait(); }
  void all_gather(const void* send, int64_t count, void* recv, Elem e) {
    iall_gather(send, count, recv, e).wait();
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, Elem e) {
    ireduce_scatter(send, recv, count, e).wait();
  }
  void broadcast(void* data, int64_t count, Elem e, int root) {
    ibroadcast(data, count, e, root).wait();
  }
  double all_reduce_sum(double v) {
    all_reduce(&v, 1, Elem::F64);
    return v;
  }
  int64_t all_reduce_sum(int64_t v) {
    all_reduce(&v, 1, Elem::I64);
    return v;
  }

  // Brings the device times of completed collectives into stats() (device_seconds); called once
  // per step, after the step's last wait. Collectives still running count in a later call.
  virtual void settle_stats() {
    for (CollectiveStats& c : stats_.per) c.device_seconds = c.seconds;
  }
  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

 protected:
  // One count and displacement per peer, or ValueError naming this rank.
  void check_peer_counts(const std::vector<int64_t>& send_counts,
                         const std::vector<int64_t>& send_displs,
                         const std::vector<int64_t>& recv_counts,
                         const std::vector<int64_t>& recv_displs) const;

  CommStats stats_;
};

// World of one process: every collective is a copy; no MPI call is made.
std::unique_ptr<Comm> make_local_comm();

// This rank's index among the ranks of `world` on the same host (collective): one process per
// GPU takes device local_rank % devices.
int local_rank(Comm& world);

// Owns MPI_Init_thread / MPI_Finalize for the lifetime of a program (cli or test driver).
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  // MPI_COMM_WORLD wrapped (not owned); errors are returned to us and thrown as CommError.
  std::unique_ptr<Comm> world(const CommOptions& opt = {}) const;
  // True when started by mpirun (more than one process, or an MPI launcher environment).
  static bool launched_by_mpirun();
};

}  // namespace mt::par
